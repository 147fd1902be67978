"""What every tunnelctl command module shares."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from tunnel_server.ctl.client import ApiClient

__all__ = ["Command", "Subparsers", "output_flag"]

Command = Callable[[ApiClient, argparse.Namespace], int]
Subparsers = Any  # argparse's _SubParsersAction, which has no public name


def output_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", choices=["text", "json"], default="text")
