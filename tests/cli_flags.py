"""Helpers for the tests of the CLIs' flags and their environment variables."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def in_a_scratch_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No TUNNEL_* variable from this machine, relative paths under tmp_path, a few files."""
    for name in list(os.environ):
        if name.startswith(("TUNNEL_AGENT_", "TUNNEL_SERVER_")):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    files = {
        "base-ca.pem": "base CA\n",
        "env-ca.pem": "env CA\n",
        "flag-ca.pem": "flag CA\n",
        "env-token": "tbt_from_env_file\n",
        "flag-token": "  tbt_from_flag_file \n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)


@dataclass(frozen=True)
class FlagCase:
    """A flag, its variable, a value for each, and what each value makes of the settings.

    A ``flag_value`` of None is a switch (``store_true``): given, it is on;
    ``env_against_flag`` is then the variable's value the switch must beat.
    """

    flag: str
    env: str
    env_value: str
    flag_value: str | None
    read: Callable[[argparse.Namespace, Any], object]
    from_env: object
    from_flag: object
    env_against_flag: str | None = None

    def __str__(self) -> str:
        return self.flag

    def argv(self) -> list[str]:
        # --flag=value, so that a value starting with '-' is not taken for a flag.
        return [self.flag] if self.flag_value is None else [f"{self.flag}={self.flag_value}"]


def options_of(parser: argparse.ArgumentParser, command: str) -> set[str]:
    """The long options of a sub-command (argparse keeps them in private attributes)."""
    [subparsers] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    sub: argparse.ArgumentParser = subparsers.choices[command]
    return {
        option
        for action in sub._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    }


def as_argv(options: dict[str, str]) -> list[str]:
    return [f"{flag}={value}" for flag, value in options.items()]


def without(base: dict[str, str], flag: str) -> list[str]:
    return as_argv({name: value for name, value in base.items() if name != flag})
