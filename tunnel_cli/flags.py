"""Flags backed by environment variables, and duration parsing."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from protocol.errors import TunnelError

__all__ = ["FlagError", "OnCommandLine", "describe_duration", "env_flag", "parse_duration"]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$", re.ASCII)
#: Longer than any duration a flag means: a century.
_LONGEST = timedelta(days=36_525)
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


class FlagError(TunnelError):
    """A flag or its environment variable has a value that cannot be used."""


def parse_duration(text: str) -> timedelta:
    """``"30d"``, ``"24h"``, ``"90s"``, ``"250ms"`` or plain seconds, as a timedelta."""
    match = _DURATION.match(text)
    if match is None or len(text) > 32:
        raise FlagError(f"{text[:32]!r} is not a duration; use e.g. 30s, 15m, 24h or 30d")
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds > _LONGEST.total_seconds():
        raise FlagError(f"{text!r} is too long a duration; at most {_LONGEST.days}d")
    return timedelta(seconds=seconds)


def describe_duration(span: timedelta) -> str:
    """``span`` as :func:`parse_duration` reads it, in its largest whole unit (``"30d"``)."""
    seconds = int(span.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def env_flag(
    parser: argparse.ArgumentParser | Any,
    flag: str,
    env: str,
    *,
    default: Any = None,
    help: str,
    **kwargs: Any,
) -> None:
    """Add ``flag`` whose default comes from the environment variable ``env``.

    The flag wins over the variable, the variable over ``default``. Boolean
    flags (``action="store_true"``) accept 1/true/yes/on in the variable.
    """
    value = os.environ.get(env)
    if value is not None:
        if kwargs.get("action") == "store_true":
            default = value.strip().lower() in {"1", "true", "yes", "on"}
        else:
            default = value
    parser.add_argument(flag, default=default, help=f"{help} [env {env}]", **kwargs)


class OnCommandLine(argparse.Action):
    """Store the value, and note that it came as a flag (``<dest>_on_command_line``).

    For a secret a flag would show to everyone on the machine (``ps``): the
    command warns when it came that way.

    The flag's environment variable only sets the default, so a value from
    there never passes through here.
    """

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_on_command_line", True)
