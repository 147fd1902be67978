"""How tunnelctl prints: aligned tables for people, JSON for programs."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from tunnel_cli import printable

__all__ = ["print_json", "print_table"]


def print_json(data: Any, out: TextIO | None = None) -> None:
    """``data`` as indented JSON on ``out`` (standard output, looked up at each call)."""
    out = sys.stdout if out is None else out
    json.dump(data, out, indent=2, sort_keys=False)
    out.write("\n")


def print_table(
    rows: Sequence[dict[str, Any]],
    columns: Sequence[tuple[str, str]],
    out: TextIO | None = None,
) -> None:
    """``columns`` are (heading, key) pairs; missing values print as ``-``.

    ``out`` is standard output unless given (looked up at each call, so that a
    replaced ``sys.stdout`` is the one written to).
    """
    out = sys.stdout if out is None else out
    cells = [[heading for heading, _ in columns]]
    for row in rows:
        cells.append([_cell(row.get(key)) for _, key in columns])
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    for line in cells:
        out.write("  ".join(text.ljust(width) for text, width in zip(line, widths, strict=True)))
        out.write("\n")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ",".join(str(v) for v in value) or "-"
    if isinstance(value, dict):
        return " ".join(f"{key}={_cell(item)}" for key, item in value.items()) or "-"
    return printable(str(value))  # what the server returns may carry control characters
