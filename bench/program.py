"""Run a Python program as it would run on its own, inside a benchmark's wrapper.

The wrappers (:mod:`bench.profiled`, :mod:`bench.traced`) set up signal
handlers, then hand the process over to the program: ``runpy`` gives it
``__main__`` and its own ``sys.argv``. After ``--`` comes the command line
the program would have had: a script, or this interpreter with a script or
``-m MODULE``.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Wrapping", "parse_wrapping", "run_program"]


@dataclass(frozen=True, slots=True)
class Wrapping:
    """A wrapper's command line: where it writes (``--out``), and the program's."""

    parser: argparse.ArgumentParser
    out: str
    command: list[str]


def parse_wrapping(
    prog: str, description: str | None, out_help: str, argv: Sequence[str] | None
) -> Wrapping:
    """``--out FILE -- COMMAND LINE`` (the parser exits if no command line follows)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--out", required=True, help=out_help)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND LINE")
    args = parser.parse_args(argv)
    words: list[str] = args.command
    command = words[1:] if words[:1] == ["--"] else words
    if not command:
        parser.error("give the program's command line after --")
    return Wrapping(parser, args.out, command)


def run_program(parser: argparse.ArgumentParser, command: Sequence[str]) -> None:
    """Run ``command`` in this process, as ``__main__``."""
    command = list(command)
    if _is_python(command[0]):
        command = command[1:]  # this interpreter runs it
        if command[:1] == ["-m"] and len(command) >= 2:
            sys.argv = command[1:]
            runpy.run_module(command[1], run_name="__main__", alter_sys=True)
            return
    if not command:
        parser.error("give a script or -m MODULE after the interpreter")
    sys.argv = command
    runpy.run_path(command[0], run_name="__main__")


def _is_python(executable: str) -> bool:
    return os.path.realpath(executable) == os.path.realpath(sys.executable)
