"""The project's one error hierarchy, and the protocol's wire error codes.

Every error the project raises on purpose derives from :class:`TunnelError`.
The protocol's own errors live here; the agent and the server add their
subtrees in their own ``errors`` modules::

    TunnelError
    └── ProtocolError                     carries an ErrorCode
        ├── LocalProtocolError            this side used the API wrongly
        │   ├── HandshakeIncompleteError  no stream before both HELLOs
        │   ├── ConnectionClosedError     the connection has ended
        │   ├── GoingAwayError            GOAWAY sent or received: no new streams
        │   ├── StreamLimitError          the peer's max_streams is reached
        │   ├── StreamIdsExhaustedError   no stream ids left: reconnect
        │   ├── UnknownStreamError        no such stream on this connection
        │   ├── StreamStateError          not allowed in the stream's state
        │   ├── SendBufferFullError       more queued than max_send_buffer
        │   ├── HeaderTooLargeError       headers over the peer's max_header_size
        │   └── AcknowledgeError          acknowledged more than was received
        └── RemoteProtocolError           the peer broke the protocol
            ├── MalformedFrameError       bytes that are not a valid frame
            ├── FrameSizeError            a message or payload over the limit
            ├── FlowControlError          data beyond credit, window overflow
            ├── UnsupportedVersionError   no protocol version in common
            ├── ExcessiveLoadError        the peer floods control frames
            └── KeepaliveTimeoutError     no PONG within the keepalive deadline

Local errors never reach the wire. Remote errors that end the connection are
raised from ``Connection.receive_data`` after a GOAWAY with their code has been
queued; errors that concern one stream reset that stream instead (see
docs/protocol.md, "Errors").
"""

from __future__ import annotations

import enum

__all__ = [
    "AcknowledgeError",
    "ConnectionClosedError",
    "ErrorCode",
    "ExcessiveLoadError",
    "FlowControlError",
    "FrameSizeError",
    "GoingAwayError",
    "HandshakeIncompleteError",
    "HeaderTooLargeError",
    "KeepaliveTimeoutError",
    "LocalProtocolError",
    "MalformedFrameError",
    "ProtocolError",
    "RemoteProtocolError",
    "SendBufferFullError",
    "StreamIdsExhaustedError",
    "StreamLimitError",
    "StreamStateError",
    "TunnelError",
    "UnknownStreamError",
    "UnsupportedVersionError",
]


class ErrorCode(enum.IntEnum):
    """Codes carried by RESET and GOAWAY frames (docs/protocol.md, "Error codes").

    Codes 0x100 and above belong to the application (the kind of the stream
    says what they mean); a receiver passes unknown codes through as integers.
    """

    NO_ERROR = 0x0
    PROTOCOL_ERROR = 0x1
    INTERNAL_ERROR = 0x2
    FLOW_CONTROL_ERROR = 0x3
    STREAM_CLOSED = 0x4
    FRAME_SIZE_ERROR = 0x5
    REFUSED_STREAM = 0x6
    CANCEL = 0x7
    UNSUPPORTED_VERSION = 0x8
    HEADER_TOO_LARGE = 0x9
    EXCESSIVE_LOAD = 0xA
    TIMEOUT = 0xB


def describe_code(code: int) -> str:
    """A code's name when it is a protocol code, else its number."""
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"application error {code:#x}"


class TunnelError(Exception):
    """Root of every error this project raises on purpose."""


class ProtocolError(TunnelError):
    """A violation of the tunnel protocol, by either side."""

    code: ErrorCode = ErrorCode.PROTOCOL_ERROR

    def __init__(self, message: str, *, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class LocalProtocolError(ProtocolError):
    """This side asked for something the protocol does not allow; nothing was sent."""

    code = ErrorCode.INTERNAL_ERROR


class HandshakeIncompleteError(LocalProtocolError):
    """Streams and messages wait until both HELLO frames have been exchanged."""


class ConnectionClosedError(LocalProtocolError):
    """The connection has ended; open a new one."""


class GoingAwayError(LocalProtocolError):
    """A GOAWAY was sent or received, so no new stream may be opened here."""

    code = ErrorCode.REFUSED_STREAM


class StreamLimitError(LocalProtocolError):
    """The peer's limit of concurrent streams is reached; retry when one ends."""

    code = ErrorCode.REFUSED_STREAM


class StreamIdsExhaustedError(LocalProtocolError):
    """Every stream id of this side has been used; reconnect for fresh ones."""

    code = ErrorCode.REFUSED_STREAM


class UnknownStreamError(LocalProtocolError):
    """The stream id names no stream that is open on this connection."""


class StreamStateError(LocalProtocolError):
    """The command is not allowed in the stream's present state."""

    code = ErrorCode.STREAM_CLOSED


class SendBufferFullError(LocalProtocolError):
    """More data was queued on a stream than its send buffer holds."""

    code = ErrorCode.FLOW_CONTROL_ERROR


class HeaderTooLargeError(LocalProtocolError):
    """Headers or a message body larger than the peer accepts."""

    code = ErrorCode.HEADER_TOO_LARGE


class AcknowledgeError(LocalProtocolError):
    """More bytes were acknowledged on a stream than it has delivered."""

    code = ErrorCode.FLOW_CONTROL_ERROR


class RemoteProtocolError(ProtocolError):
    """The peer broke the protocol; ``code`` is what goes on the wire."""


class MalformedFrameError(RemoteProtocolError):
    """Bytes that do not decode to a valid frame."""


class FrameSizeError(RemoteProtocolError):
    """A message or a DATA payload larger than this side accepts."""

    code = ErrorCode.FRAME_SIZE_ERROR


class FlowControlError(RemoteProtocolError):
    """Data beyond the credit given, or a window grown past its maximum."""

    code = ErrorCode.FLOW_CONTROL_ERROR


class UnsupportedVersionError(RemoteProtocolError):
    """The two sides have no protocol version in common."""

    code = ErrorCode.UNSUPPORTED_VERSION


class ExcessiveLoadError(RemoteProtocolError):
    """The peer floods control frames: more queued than agreed, or more than its allowance.

    See ``MAX_CONTROL_QUEUE`` (protocol/outbox.py) and protocol/allowance.py.
    """

    code = ErrorCode.EXCESSIVE_LOAD


class KeepaliveTimeoutError(RemoteProtocolError):
    """The peer did not answer a PING within the keepalive deadline."""

    code = ErrorCode.TIMEOUT
