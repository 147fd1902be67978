"""Durations as command specs write them: ``30s``, ``10m``, ``1h``, ``1h30m``."""

from __future__ import annotations

import re

from .errors import CommandSpecError

__all__ = ["format_duration", "parse_duration"]

_DURATION = re.compile(r"^(?:(\d{1,6})h)?(?:(\d{1,6})m)?(?:(\d{1,6})s)?$")


def parse_duration(value: object, path: str, *, minimum: int, maximum: int) -> int:
    """Whole seconds from ``value`` (a string like ``10m``), between the bounds inclusive."""
    hint = "must be a duration such as 30s, 10m or 1h30m"
    if not isinstance(value, str):
        raise CommandSpecError(path, hint)
    match = _DURATION.fullmatch(value)
    if not value or match is None:
        raise CommandSpecError(path, hint)
    hours, minutes, seconds = (int(part) if part else 0 for part in match.groups())
    total = hours * 3600 + minutes * 60 + seconds
    if not minimum <= total <= maximum:
        raise CommandSpecError(
            path, f"must be between {format_duration(minimum)} and {format_duration(maximum)}"
        )
    return total


def format_duration(seconds: int) -> str:
    """The canonical spelling of ``seconds`` (``1h30m``, ``45s``), which Go also parses."""
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = "".join(
        f"{amount}{unit}" for amount, unit in ((hours, "h"), (minutes, "m"), (secs, "s")) if amount
    )
    return text or "0s"
