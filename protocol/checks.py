"""Checks on what a connection puts in frames: encoded sizes, kinds, codes, reasons.

A frame this side queues must be one the peer accepts, or the peer fails the
connection; a map the peer sent is measured as it would be encoded again. The
rules are docs/protocol.md's "msgpack rules" and "Frames" (string keys only,
kinds of 1 to 64 characters, codes below 2**32, reasons cut to 256
characters) and "Limits" (header and body sizes). The connection raises
``ValueError`` for a caller's argument that fails them (docs/protocol.md,
"Errors").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgpack

from .frames import MAX_KIND_LENGTH, MAX_REASON_LENGTH

__all__ = [
    "MAX_GROWTH",
    "check_code",
    "checked_kind_size",
    "checked_size",
    "packed_size",
    "short_reason",
]

#: How many times its received size a decoded map can take when encoded again:
#: a float32 (5 bytes) comes back as a float64 (9); everything else encodes
#: again in its shortest form, never longer. So a map in a message of at most
#: ``limit // MAX_GROWTH`` bytes cannot measure over ``limit``.
MAX_GROWTH = 2


def packed_size(value: Mapping[str, Any]) -> int:
    """Encoded size of a map decoded from the peer (which always encodes again)."""
    return len(msgpack.packb(value))


def checked_size(value: Mapping[str, Any]) -> int:
    """Encoded size of a map from this side's caller, refusing what the peer cannot decode.

    The peer decodes maps with string keys only (docs/protocol.md, "Frames"):
    a map that encodes but does not decode there would fail the connection.
    """
    try:
        packed = msgpack.packb(value)
        msgpack.unpackb(packed, raw=False, strict_map_key=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"cannot encode as msgpack for the peer: {exc}") from exc
    return len(packed)


def checked_kind_size(kind: str, what: str) -> int:
    """Encoded length of a stream or message kind, after checking the peer accepts it."""
    if not 0 < len(kind) <= MAX_KIND_LENGTH:
        raise ValueError(f"{what} kind must have 1..{MAX_KIND_LENGTH} characters")
    try:
        return len(kind.encode())
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} kind must be valid Unicode text") from exc


def check_code(code: int) -> None:
    """Refuse an error code that does not fit the wire's 32 bits."""
    if not 0 <= code < 2**32:
        raise ValueError(f"error code {code} is outside 0..2**32-1")


def short_reason(reason: str) -> str:
    """A reason the peer accepts: cut to MAX_REASON_LENGTH characters, encodable."""
    if len(reason) > MAX_REASON_LENGTH:
        reason = reason[: MAX_REASON_LENGTH - 1] + "…"
    if not reason.isascii():
        # Lone surrogates cannot be sent; they must not break the connection.
        reason = reason.encode("utf-8", "replace").decode("utf-8")
    return reason
