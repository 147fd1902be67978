"""The receive side of a connection: what each frame from the peer does.

:meth:`Connection.receive_data <protocol.connection.Connection.receive_data>`
decodes a message and hands its frames to :func:`handle_frames`, which applies
each to the connection and appends the events it yields. The rules are those
of docs/protocol.md: "Handshake" and "Versioning" (HELLO), "Stream states" and
"Stream ids" (OPEN, DATA, RESET), "Flow control" (DATA, WINDOW), "Liveness"
(PING, PONG), "Shutdown" (GOAWAY) and "Limits" (OPEN headers, MESSAGE bodies).
A violation raises a :class:`~protocol.errors.RemoteProtocolError` (the
connection then fails) or resets the one stream at fault.

The handlers are functions of the connection rather than methods or a mixin:
they are the connection's transitions on receipt, so they read and write its
package-internal state, and mypy checks every such use against the one class
that holds it. Receiving DATA is a hot path: each handler does exactly the
work it did as a method, and the split adds one function call per message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .checks import packed_size
from .errors import (
    ErrorCode,
    ExcessiveLoadError,
    FlowControlError,
    FrameSizeError,
    MalformedFrameError,
    describe_code,
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
from .frames import (
    DataFrame,
    Frame,
    GoAwayFrame,
    HelloFrame,
    MessageFrame,
    OpenFrame,
    PingFrame,
    PongFrame,
    ResetFrame,
    WindowFrame,
)
from .handshake import negotiate
from .limits import MAX_WINDOW
from .outbox import MAX_CONTROL_QUEUE
from .state import ConnectionState
from .streams import Stream, StreamState

if TYPE_CHECKING:
    from .connection import Connection

__all__ = ["handle_frames"]


def handle_frames(conn: Connection, frames: list[Frame], now: float, events: list[Event]) -> None:
    """Apply one message's frames to ``conn`` in order, appending their events."""
    for frame in frames:
        if conn.closed:
            break  # a GOAWAY with an error ended it mid-message
        if type(frame) is DataFrame:
            _data(conn, frame, now, events)
            continue
        if conn.state is ConnectionState.HANDSHAKE:
            _in_handshake(conn, frame, now, events)
            continue
        # Every frame but DATA carries nothing: see protocol/allowance.py.
        conn._outbox.allowance.spend(now)
        if type(frame) is WindowFrame:
            _window(conn, frame, events)
        elif type(frame) is OpenFrame:
            _open(conn, frame, events)
        elif type(frame) is ResetFrame:
            _reset(conn, frame, events)
        elif type(frame) is PingFrame:
            control = conn._outbox.control
            if len(control) >= MAX_CONTROL_QUEUE:
                raise ExcessiveLoadError("the peer sends PINGs faster than it reads")
            control.append((PongFrame(frame.opaque), 24))
        elif type(frame) is PongFrame:
            _pong(conn, frame, now, events)
        elif type(frame) is MessageFrame:
            _message(conn, frame, events)
        elif type(frame) is GoAwayFrame:
            _goaway(conn, frame, events)
        else:
            raise MalformedFrameError("HELLO after the handshake")


def _in_handshake(conn: Connection, frame: Frame, now: float, events: list[Event]) -> None:
    if type(frame) is GoAwayFrame:
        conn._outbox.allowance.spend(now)
        _goaway(conn, frame, events)
        return
    if type(frame) is not HelloFrame:
        raise MalformedFrameError(f"expected HELLO first, got {type(frame).__name__}")
    version, capabilities = negotiate(conn._versions, conn._local_capabilities, frame)
    conn.version = version
    conn.peer_limits = frame.limits
    conn.peer_info = frame.info
    conn.capabilities = capabilities
    conn._outbox.window = frame.limits.connection_window
    conn._outbox.allowance.since = now
    conn.state = ConnectionState.OPEN
    events.append(HandshakeCompleted(version, frame.limits, conn.capabilities, frame.info))


def _data(conn: Connection, frame: DataFrame, now: float, events: list[Event]) -> None:
    if conn.state is ConnectionState.HANDSHAKE:
        raise MalformedFrameError("expected HELLO first, got DATA")
    size = len(frame.data)
    if size > conn._recv_window:
        raise FlowControlError(
            f"the peer sent {size} bytes with {conn._recv_window} bytes of connection credit"
        )
    conn._recv_window -= size
    conn.stats.bytes_received += size
    stream = conn._streams.get(frame.stream_id)
    if stream is None:
        # A stream that already ended: frames in flight are dropped, but
        # their connection credit is returned (docs/protocol.md, "Flow control").
        _require_known(conn, frame.stream_id, "DATA")
        if not size:
            # Payload is paid for by credit, as on an open stream; an END here
            # is a race with this side's RESET at most once a stream.
            conn._outbox.allowance.spend(now)
        conn._return_connection_credit()
        return
    state = stream.state
    if state is not StreamState.OPEN and state is not StreamState.HALF_CLOSED_LOCAL:
        conn._outbox.allowance.spend(now)
        _reset_for_violation(
            conn, stream, ErrorCode.STREAM_CLOSED, "DATA after the end of the stream", events
        )
        conn._return_connection_credit()
        return
    if size > stream.recv_window:
        conn._outbox.allowance.spend(now)
        _reset_for_violation(
            conn, stream, ErrorCode.FLOW_CONTROL_ERROR, "DATA beyond the stream's credit", events
        )
        conn._return_connection_credit()
        return
    conn._sharing.recent.touch(stream.id, conn.stats.bytes_received)
    if size:
        stream.recv_window -= size
        stream.buffered += size
        conn._buffered += size
        events.append(DataReceived(stream.id, frame.data))  # type: ignore[arg-type]
        # A sharing stream's credit may be owed on delivery, before the consumer
        # reads (docs/protocol.md, "Sharing the connection"); cheap test first.
        if stream.recv_window < conn._sharing.shared_target and not frame.end_stream:
            conn._return_stream_credit(stream)
        # Cheap test first: nothing can be owed below the threshold.
        if conn._connection_window - conn._recv_window >= conn._connection_threshold:
            conn._return_connection_credit()
    elif not frame.end_stream:
        conn._outbox.allowance.spend(now)  # carries nothing: see protocol/allowance.py
    if frame.end_stream:
        events.append(StreamEnded(stream.id))
        if state is StreamState.OPEN:
            stream.state = StreamState.HALF_CLOSED_REMOTE
        else:
            stream.state = StreamState.CLOSED
            if not stream.pending_end:
                conn._finish(stream, StreamState.CLOSED)


def _open(conn: Connection, frame: OpenFrame, events: list[Event]) -> None:
    stream_id = frame.stream_id
    if stream_id % 2 != conn._remote_parity:
        raise MalformedFrameError(f"the peer opened stream {stream_id}, an id of this side's")
    if stream_id <= conn._highest_remote_id:
        raise MalformedFrameError(
            f"the peer opened stream {stream_id} after {conn._highest_remote_id}; "
            "stream ids must increase"
        )
    conn._highest_remote_id = stream_id
    limits = conn.limits
    outbox = conn._outbox
    if conn._goaway_sent is not None:
        outbox.queue_reset(
            stream_id, ErrorCode.REFUSED_STREAM, "this side is going away", peer_caused=True
        )
        return
    if conn._remote_open >= limits.max_streams:
        outbox.queue_reset(
            stream_id,
            ErrorCode.REFUSED_STREAM,
            f"too many concurrent streams (limit {limits.max_streams})",
            peer_caused=True,
        )
        return
    taken = conn._stream_kinds
    if taken is not None and frame.kind not in taken:
        outbox.queue_reset(
            stream_id,
            ErrorCode.REFUSED_STREAM,
            f"this side takes no {frame.kind} streams",
            peer_caused=True,
        )
        return
    # A message too short to hold an oversized map is not measured again.
    if not conn._maps_fit:
        size = packed_size(frame.headers)
        if size > limits.max_header_size:
            outbox.queue_reset(
                stream_id,
                ErrorCode.HEADER_TOO_LARGE,
                f"headers of {size} bytes exceed {limits.max_header_size}",
                peer_caused=True,
            )
            return
    assert conn.peer_limits is not None
    stream = Stream(
        stream_id,
        frame.kind,
        local=False,
        send_window=conn.peer_limits.initial_window,
        recv_window=limits.initial_window,
    )
    conn._streams[stream_id] = stream
    conn._sharing.recent.touch(stream_id, conn.stats.bytes_received)
    conn._remote_open += 1
    conn.stats.streams_opened += 1
    events.append(StreamOpened(stream_id, frame.kind, frame.headers, frame.end_stream))
    if frame.end_stream:
        stream.state = StreamState.HALF_CLOSED_REMOTE
        events.append(StreamEnded(stream_id))


def _reset(conn: Connection, frame: ResetFrame, events: list[Event]) -> None:
    stream = conn._streams.get(frame.stream_id)
    if stream is None:
        _require_known(conn, frame.stream_id, "RESET")
        return
    conn._finish(stream, StreamState.RESET)
    events.append(StreamReset(frame.stream_id, frame.code, frame.reason, remote=True))


def _window(conn: Connection, frame: WindowFrame, events: list[Event]) -> None:
    if frame.stream_id == 0:
        outbox = conn._outbox
        if outbox.window + frame.increment > MAX_WINDOW:
            raise FlowControlError("the peer grew the connection window past 2**31-1")
        outbox.window += frame.increment
        return
    stream = conn._streams.get(frame.stream_id)
    if stream is None:
        _require_known(conn, frame.stream_id, "WINDOW")
        return
    if stream.send_window + frame.increment > MAX_WINDOW:
        _reset_for_violation(
            conn, stream, ErrorCode.FLOW_CONTROL_ERROR, "stream window grown past 2**31-1", events
        )
        return
    stream.send_window += frame.increment
    if stream.pending_size and not stream.scheduled:
        stream.scheduled = True
        conn._outbox.ready.append(stream)


def _pong(conn: Connection, frame: PongFrame, now: float, events: list[Event]) -> None:
    rtt = conn._liveness.pong(frame.opaque, now)
    if rtt is None:
        return
    conn.rtt = rtt
    conn._sharing.rtt_measured(rtt)
    events.append(PongReceived(frame.opaque, rtt))


def _message(conn: Connection, frame: MessageFrame, events: list[Event]) -> None:
    # The body is bounded like an OPEN's headers (docs/protocol.md, "Limits"),
    # but belongs to no stream: over the limit, the connection fails.
    if not conn._maps_fit:
        size = packed_size(frame.body)
        if size > conn.limits.max_header_size:
            raise FrameSizeError(
                f"MESSAGE body of {size} bytes exceeds the limit of {conn.limits.max_header_size}",
                code=ErrorCode.HEADER_TOO_LARGE,
            )
    events.append(MessageReceived(frame.kind, frame.body))


def _goaway(conn: Connection, frame: GoAwayFrame, events: list[Event]) -> None:
    last = frame.last_stream_id
    previous = conn._goaway_received
    if previous is not None:
        last = min(last, previous)
    conn._goaway_received = last
    events.append(GoAwayReceived(last, frame.code, frame.reason))
    if last == previous and frame.code == ErrorCode.NO_ERROR:
        return  # nothing new: the streams above it were refused at the first
    if frame.code != ErrorCode.NO_ERROR:
        for stream in list(conn._streams.values()):
            # Above ``last`` the peer never saw the stream: safe to retry.
            code = ErrorCode.REFUSED_STREAM if stream.local and stream.id > last else frame.code
            events.append(StreamReset(stream.id, code, frame.reason, remote=True))
        conn._end_connection(frame.code, frame.reason or describe_code(frame.code))
        return
    # Streams this side opened above ``last`` were never seen: refused,
    # safe to retry on another connection (docs/protocol.md, "Shutdown").
    for stream in list(conn._streams.values()):
        if stream.local and stream.id > last:
            conn._finish(stream, StreamState.RESET)
            events.append(
                StreamReset(
                    stream.id, ErrorCode.REFUSED_STREAM, "the peer is going away", remote=True
                )
            )


def _reset_for_violation(
    conn: Connection, stream: Stream, code: ErrorCode, reason: str, events: list[Event]
) -> None:
    """Reset the one stream the peer misused, and say so (docs/protocol.md, "Errors")."""
    conn._outbox.queue_reset(stream.id, code, reason, peer_caused=True)
    conn._finish(stream, StreamState.RESET)
    events.append(StreamReset(stream.id, code, reason, remote=False))


def _require_known(conn: Connection, stream_id: int, name: str) -> None:
    if not conn._is_known(stream_id):
        raise MalformedFrameError(f"{name} on stream {stream_id}, which was never opened")
