"""Limits each side announces in its HELLO, and the local keepalive policy.

Each side states what it accepts; the peer must stay within it
(docs/protocol.md, "Limits").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import MalformedFrameError

__all__ = [
    "MAX_STREAM_ID",
    "MAX_WINDOW",
    "MESSAGE_OVERHEAD",
    "MIN_FRAME_SIZE",
    "Keepalive",
    "Limits",
]

#: Largest window and largest increment, as in HTTP/2.
MAX_WINDOW = 2**31 - 1
#: Stream ids are positive and below 2**31.
MAX_STREAM_ID = 2**31 - 1
#: The smallest max_frame_size a side may announce; a HELLO always fits in it.
MIN_FRAME_SIZE = 16 * 1024
#: Room for the envelope of one frame in a message, beyond its payload.
MESSAGE_OVERHEAD = 1024
#: Largest max_frame_size a side may announce (16 MiB).
MAX_FRAME_SIZE = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Limits:
    """What this side accepts from its peer.

    max_frame_size: largest DATA payload in one frame. A WebSocket message
        (a batch of frames) is at most ``max_frame_size + MESSAGE_OVERHEAD``.
    max_header_size: largest encoded header map of an OPEN frame and body of
        a MESSAGE frame; at most max_frame_size.
    max_streams: streams the peer may have open toward this side at once.
    initial_window: credit for each new stream, in bytes.
    connection_window: credit for the whole connection, in bytes.
    max_send_buffer: bytes this side queues per stream before it refuses more
        (local only, not announced).
    max_send_buffer_total: bytes this side queues on all streams together; with
        many streams open it, not the per-stream bound, caps the memory held for
        a slow peer (local only, not announced).
    shared_window: the credit this side keeps a stream near, instead of
        ``initial_window``, while other streams are active on the connection, so
        that one transfer's bytes in flight do not queue in front of theirs
        (local only, not announced; capped at ``initial_window``).
    shared_span: how long another stream's activity counts as recent, in bytes
        received on the connection since; 0 never shares (local only).
    shared_rate: bytes per second a stream keeps while sharing, whatever the
        round trip: the shared target is at least this rate times the smallest
        round trip (local only).
    """

    max_frame_size: int = 64 * 1024
    max_header_size: int = 32 * 1024
    max_streams: int = 2048
    initial_window: int = 1024 * 1024
    connection_window: int = 16 * 1024 * 1024
    max_send_buffer: int = 1024 * 1024
    max_send_buffer_total: int = 32 * 1024 * 1024
    shared_window: int = 64 * 1024
    shared_span: int = 2 * 1024 * 1024
    shared_rate: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        problems = _problems(self)
        if problems:
            raise ValueError("invalid limits: " + "; ".join(problems))

    @property
    def message_limit(self) -> int:
        """Largest WebSocket message this side accepts."""
        return self.max_frame_size + MESSAGE_OVERHEAD

    def to_wire(self) -> dict[str, int]:
        """The announced part, as the HELLO's ``limits`` map."""
        return {
            "max_frame_size": self.max_frame_size,
            "max_header_size": self.max_header_size,
            "max_streams": self.max_streams,
            "initial_window": self.initial_window,
            "connection_window": self.connection_window,
        }

    @classmethod
    def from_wire(cls, value: Any) -> Limits:
        """Read a peer's ``limits`` map; unknown keys are ignored, bad ones refused."""
        if not isinstance(value, Mapping):
            raise MalformedFrameError("HELLO limits must be a map")
        fields: dict[str, int] = {}
        for name in (
            "max_frame_size",
            "max_header_size",
            "max_streams",
            "initial_window",
            "connection_window",
        ):
            item = value.get(name)
            if type(item) is not int:
                raise MalformedFrameError(f"HELLO limit {name} must be an integer")
            fields[name] = item
        try:
            return cls(**fields)
        except ValueError as exc:
            raise MalformedFrameError(f"peer announced {exc}") from exc

    def replace(self, **changes: int) -> Limits:
        """A copy with some limits changed."""
        return dataclasses.replace(self, **changes)


def _problems(limits: Limits) -> list[str]:
    problems = []
    if not MIN_FRAME_SIZE <= limits.max_frame_size <= MAX_FRAME_SIZE:
        problems.append(
            f"max_frame_size {limits.max_frame_size} is outside {MIN_FRAME_SIZE}..{MAX_FRAME_SIZE}"
        )
    if not 1024 <= limits.max_header_size <= limits.max_frame_size:
        problems.append(f"max_header_size {limits.max_header_size} is outside 1024..max_frame_size")
    if not 1 <= limits.max_streams <= 1_000_000:
        problems.append(f"max_streams {limits.max_streams} is outside 1..1000000")
    if not 1 <= limits.initial_window <= MAX_WINDOW:
        problems.append(f"initial_window {limits.initial_window} is outside 1..{MAX_WINDOW}")
    if not 1 <= limits.connection_window <= MAX_WINDOW:
        problems.append(f"connection_window {limits.connection_window} is outside 1..{MAX_WINDOW}")
    if limits.max_send_buffer < 1:
        problems.append("max_send_buffer must be positive")
    if limits.max_send_buffer_total < limits.max_send_buffer:
        problems.append("max_send_buffer_total must be at least max_send_buffer")
    if limits.shared_window < 1:
        problems.append("shared_window must be positive")
    if limits.shared_span < 0:
        problems.append("shared_span must not be negative")
    if limits.shared_rate < 1:
        problems.append("shared_rate must be positive")
    return problems


@dataclass(frozen=True, slots=True)
class Keepalive:
    """When to ping a peer, and how long to wait for its PONG (seconds).

    ``interval`` and ``timeout``: a peer quiet for ``interval`` is pinged, and
    must answer within ``timeout``. ``probe_after`` and ``probe_timeout``: new
    work for a peer quiet for ``probe_after`` (a stream opened, data or a message sent)
    sends a PING with it, which must be answered within ``probe_timeout``, so
    that work is not left waiting on a dead link for the whole keepalive
    (docs/protocol.md, "Liveness").
    """

    interval: float = 15.0
    timeout: float = 15.0
    probe_after: float = 1.0
    probe_timeout: float = 5.0

    def __post_init__(self) -> None:
        if min(self.interval, self.timeout, self.probe_after, self.probe_timeout) <= 0:
            raise ValueError("keepalive intervals and timeouts must be positive")
