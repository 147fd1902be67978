"""Events: what ``Connection.receive_data`` reports the peer did.

Named in the past tense; each is a frozen value (docs/protocol.md, "Events").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .limits import Limits

__all__ = [
    "DataReceived",
    "Event",
    "GoAwayReceived",
    "HandshakeCompleted",
    "MessageReceived",
    "PongReceived",
    "StreamEnded",
    "StreamOpened",
    "StreamReset",
]


@dataclass(frozen=True, slots=True)
class HandshakeCompleted:
    """Both HELLOs are exchanged; streams may now be opened.

    ``capabilities`` are those both sides announced; ``peer_info`` is the
    peer's identity claims (advisory: identity comes from its certificate).
    """

    version: int
    peer_limits: Limits
    capabilities: frozenset[str]
    peer_info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, init=False)
class StreamOpened:
    """The peer opened a stream."""

    stream_id: int
    kind: str
    headers: dict[str, Any]
    end_stream: bool

    def __init__(
        self, stream_id: int, kind: str, headers: dict[str, Any], end_stream: bool = False
    ) -> None:
        object.__setattr__(self, "stream_id", stream_id)
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "headers", headers)
        object.__setattr__(self, "end_stream", end_stream)


@dataclass(frozen=True, slots=True, init=False)
class DataReceived:
    """Bytes arrived on a stream. Acknowledge them once consumed to return credit."""

    stream_id: int
    data: bytes

    def __init__(self, stream_id: int, data: bytes) -> None:
        object.__setattr__(self, "stream_id", stream_id)
        object.__setattr__(self, "data", data)


@dataclass(frozen=True, slots=True, init=False)
class StreamEnded:
    """The peer will send no more data on the stream (half-close)."""

    stream_id: int

    def __init__(self, stream_id: int) -> None:
        object.__setattr__(self, "stream_id", stream_id)


@dataclass(frozen=True, slots=True, init=False)
class StreamReset:
    """The stream ended abruptly.

    ``remote`` is true when the peer reset it (or refused it with GOAWAY), and
    false when this side reset it because the peer broke the protocol on it.
    """

    stream_id: int
    code: int
    reason: str
    remote: bool

    def __init__(self, stream_id: int, code: int, reason: str = "", remote: bool = True) -> None:
        object.__setattr__(self, "stream_id", stream_id)
        object.__setattr__(self, "code", code)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "remote", remote)


@dataclass(frozen=True, slots=True, init=False)
class PongReceived:
    """A PING this side sent was answered after ``rtt`` seconds."""

    opaque: int
    rtt: float

    def __init__(self, opaque: int, rtt: float) -> None:
        object.__setattr__(self, "opaque", opaque)
        object.__setattr__(self, "rtt", rtt)


@dataclass(frozen=True, slots=True, init=False)
class GoAwayReceived:
    """The peer accepts no stream above ``last_stream_id`` from this side.

    With code NO_ERROR, open streams continue; otherwise the peer is closing
    the connection and every stream has been reset.
    """

    last_stream_id: int
    code: int
    reason: str

    def __init__(self, last_stream_id: int, code: int, reason: str = "") -> None:
        object.__setattr__(self, "last_stream_id", last_stream_id)
        object.__setattr__(self, "code", code)
        object.__setattr__(self, "reason", reason)


@dataclass(frozen=True, slots=True, init=False)
class MessageReceived:
    """A connection-level control message."""

    kind: str
    body: dict[str, Any]

    def __init__(self, kind: str, body: dict[str, Any]) -> None:
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "body", body)


Event = (
    HandshakeCompleted
    | StreamOpened
    | DataReceived
    | StreamEnded
    | StreamReset
    | PongReceived
    | GoAwayReceived
    | MessageReceived
)
