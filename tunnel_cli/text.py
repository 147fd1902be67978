"""Text from outside, made safe to show a person in a terminal."""

from __future__ import annotations

__all__ = ["printable"]


def printable(text: str) -> str:
    """``text`` with each control character (newline, escape ...) replaced by ``?``.

    Text that came from a peer the reader does not trust (an agent's reason,
    anything a server returns) must not draw lines or rows of its own.
    """
    return text if text.isprintable() else "".join(c if c.isprintable() else "?" for c in text)
