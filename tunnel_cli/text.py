"""Text from outside, made safe to show a person in a terminal."""

from __future__ import annotations

__all__ = ["printable", "printable_line"]


def printable(text: str, keep: str = "") -> str:
    """``text`` with each control character (newline, escape ...) but those in ``keep``
    replaced by ``?``.

    Text that came from a peer the reader does not trust (an agent's reason,
    anything a server returns) must not draw lines or rows of its own.
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else "?" for c in text)


def printable_line(text: str) -> str:
    """A log line from outside as :func:`printable` makes it, tabs kept.

    A command's log comes from tools in the cluster (and a chart's or a
    module's own output): an escape sequence in it must not move the cursor,
    retitle the terminal or write to its clipboard.
    """
    return printable(text, keep="\t")
