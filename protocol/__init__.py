"""The tunnel's wire protocol, sans I/O.

Many streams multiplexed over one WebSocket, as msgpack frames, with
per-stream and per-connection flow control (docs/protocol.md). This package
imports no asyncio, sockets, clocks or logging set-up: bytes in, events out.
It depends on msgpack alone; ``tunnel_agent`` and ``tunnel_server`` build on it.
"""

from .connection import (
    MAX_PROTOCOL_VERSION,
    MIN_PROTOCOL_VERSION,
    Connection,
    ConnectionState,
    ConnectionStats,
    Side,
)
from .errors import (
    AcknowledgeError,
    ConnectionClosedError,
    ErrorCode,
    ExcessiveLoadError,
    FlowControlError,
    FrameSizeError,
    GoingAwayError,
    HandshakeIncompleteError,
    HeaderTooLargeError,
    KeepaliveTimeoutError,
    LocalProtocolError,
    MalformedFrameError,
    ProtocolError,
    RemoteProtocolError,
    SendBufferFullError,
    StreamIdsExhaustedError,
    StreamLimitError,
    StreamStateError,
    TunnelError,
    UnknownStreamError,
    UnsupportedVersionError,
)
from .events import (
    DataReceived,
    Event,
    GoAwayReceived,
    HandshakeCompleted,
    MessageReceived,
    PongReceived,
    StreamEnded,
    StreamOpened,
    StreamReset,
)
from .limits import Keepalive, Limits
from .streams import StreamState

__all__ = [
    "MAX_PROTOCOL_VERSION",
    "MIN_PROTOCOL_VERSION",
    "AcknowledgeError",
    "Connection",
    "ConnectionClosedError",
    "ConnectionState",
    "ConnectionStats",
    "DataReceived",
    "ErrorCode",
    "Event",
    "ExcessiveLoadError",
    "FlowControlError",
    "FrameSizeError",
    "GoAwayReceived",
    "GoingAwayError",
    "HandshakeCompleted",
    "HandshakeIncompleteError",
    "HeaderTooLargeError",
    "Keepalive",
    "KeepaliveTimeoutError",
    "Limits",
    "LocalProtocolError",
    "MalformedFrameError",
    "MessageReceived",
    "PongReceived",
    "ProtocolError",
    "RemoteProtocolError",
    "SendBufferFullError",
    "Side",
    "StreamEnded",
    "StreamIdsExhaustedError",
    "StreamLimitError",
    "StreamOpened",
    "StreamReset",
    "StreamState",
    "StreamStateError",
    "TunnelError",
    "UnknownStreamError",
    "UnsupportedVersionError",
]
