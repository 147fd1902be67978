"""The server's wall clock: timezone-aware UTC, what every stored time is in."""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["utcnow"]


def utcnow() -> datetime:
    return datetime.now(UTC)
