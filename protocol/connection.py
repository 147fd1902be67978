"""The sans-I/O connection: bytes in, events out; commands in, bytes out.

A :class:`Connection` is one side of one WebSocket. The I/O layer feeds it each
binary message with :meth:`Connection.receive_data` and acts on the events it
returns; it calls commands (:meth:`~Connection.open_stream`,
:meth:`~Connection.send_data` ...) and writes every message that
:meth:`~Connection.data_to_send` returns. Time enters as ``now`` arguments; the
connection never reads a clock, never blocks and never does I/O.

The rules it enforces are in docs/protocol.md; section names are cited below.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import msgpack

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
    MalformedFrameError,
    RemoteProtocolError,
    SendBufferFullError,
    StreamIdsExhaustedError,
    StreamLimitError,
    StreamStateError,
    UnknownStreamError,
    UnsupportedVersionError,
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
    MAX_CAPABILITIES,
    MAX_KIND_LENGTH,
    MAX_REASON_LENGTH,
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
    WireItem,
    data_to_wire,
    decode_message,
    encode_message,
    encode_wire,
    to_wire,
)
from .limits import MAX_STREAM_ID, MAX_WINDOW, MESSAGE_OVERHEAD, MIN_FRAME_SIZE, Keepalive, Limits
from .streams import TRANSITIONS, Stream, StreamInput, StreamState, next_state

__all__ = [
    "MAX_PROTOCOL_VERSION",
    "MIN_PROTOCOL_VERSION",
    "Connection",
    "ConnectionState",
    "ConnectionStats",
    "Side",
]

#: Protocol versions this implementation speaks (docs/protocol.md, "Versioning").
MIN_PROTOCOL_VERSION = 1
MAX_PROTOCOL_VERSION = 1

#: Control frames a peer may make this side queue (PONGs) before it is cut off.
MAX_CONTROL_QUEUE = 10_000
#: PINGs remembered for their round-trip time; older ones are forgotten.
MAX_OUTSTANDING_PINGS = 64
#: Room kept for a DATA frame's envelope when batching.
_DATA_OVERHEAD = 16
#: Room kept for an OPEN or MESSAGE frame's envelope, beyond its kind and map.
_ENVELOPE = 16
#: States that allow SEND_DATA, from the table: a tuple, because identity
#: comparison is much cheaper than hashing an enum on every write.
_SENDABLE = tuple(state for state, event in TRANSITIONS if event is StreamInput.SEND_DATA)


class Side(enum.Enum):
    """Which end of the WebSocket: the side that dialled is the client."""

    CLIENT = "client"
    SERVER = "server"


class ConnectionState(enum.Enum):
    HANDSHAKE = "handshake"
    OPEN = "open"
    CLOSED = "closed"


@dataclass(slots=True)
class ConnectionStats:
    """Counters for metrics and for proving that no stream leaks.

    Every stream counted in ``streams_opened`` is, at any moment, either still
    open or counted once in ``streams_closed``, ``streams_reset`` or
    ``streams_aborted`` (ended because the connection ended).
    """

    streams_opened: int = 0
    streams_closed: int = 0
    streams_reset: int = 0
    streams_aborted: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    messages_sent: int = 0
    messages_received: int = 0


class Connection:
    """One side of a tunnel connection (see the module docstring)."""

    def __init__(
        self,
        side: Side,
        limits: Limits | None = None,
        *,
        keepalive: Keepalive | None = None,
        capabilities: Iterable[str] = (),
        info: Mapping[str, Any] | None = None,
        versions: tuple[int, int] = (MIN_PROTOCOL_VERSION, MAX_PROTOCOL_VERSION),
    ) -> None:
        self.side = side
        self.limits = limits or Limits()
        self.keepalive = keepalive or Keepalive()
        self.state = ConnectionState.HANDSHAKE
        #: Negotiated once the handshake completes.
        self.version: int | None = None
        self.peer_limits: Limits | None = None
        self.peer_info: dict[str, Any] = {}
        self.capabilities: frozenset[str] = frozenset()
        #: Latest measured round-trip time, in seconds.
        self.rtt: float | None = None
        self.stats = ConnectionStats()
        #: Why the connection ended, once it has.
        self.close_code: int | None = None
        self.close_reason = ""

        self._min_version, self._max_version = versions
        if not 0 < self._min_version <= self._max_version < 2**16:
            raise ValueError("versions must be (min, max) with 1 <= min <= max <= 65535")
        self._local_capabilities = frozenset(capabilities)
        if len(self._local_capabilities) > MAX_CAPABILITIES or not all(
            type(name) is str and len(name) <= MAX_KIND_LENGTH for name in self._local_capabilities
        ):
            raise ValueError(
                f"capabilities must be at most {MAX_CAPABILITIES} names "
                f"of at most {MAX_KIND_LENGTH} characters"
            )
        self._streams: dict[int, Stream] = {}
        self._local_open = 0
        self._remote_open = 0
        self._next_stream_id = 1 if side is Side.CLIENT else 2
        self._remote_parity = 0 if side is Side.CLIENT else 1
        self._highest_remote_id = 0
        # Control frames with their encoded size bound; they jump the data queue.
        self._control: deque[tuple[Frame, int]] = deque()
        # Streams with data (or END) to send and credit to send it, round-robin.
        self._ready: deque[Stream] = deque()
        # Connection credit: ours to spend, and what the peer still holds.
        self._send_window = 0
        self._connection_window = self.limits.connection_window
        self._recv_window = self._connection_window
        # Bytes delivered to consumers and not yet acknowledged, all streams.
        self._buffered = 0
        self._stream_threshold = max(1, self.limits.initial_window // 4)
        self._connection_threshold = max(1, self.limits.connection_window // 4)
        self._goaway_sent: int | None = None
        self._goaway_received: int | None = None
        self._pings: dict[int, float] = {}
        self._next_ping = 1
        self._keepalive_ping: int | None = None
        self._last_received: float | None = None
        self._started: float | None = None

        info_map = dict(info or {})
        _checked_size(info_map)
        hello = HelloFrame(
            self._min_version,
            self._max_version,
            self.limits,
            self._local_capabilities,
            info_map,
        )
        size = len(encode_message([hello]))
        if size > MIN_FRAME_SIZE:
            raise ValueError(f"HELLO of {size} bytes is too large; shorten the info map")
        self._control.append((hello, size))

    # ------------------------------------------------------------------ queries

    def __repr__(self) -> str:
        return f"<Connection {self.side.value} {self.state.value} streams={len(self._streams)}>"

    @property
    def closed(self) -> bool:
        """True once the connection has ended."""
        return self.state is ConnectionState.CLOSED

    @property
    def open_streams(self) -> int:
        """Streams not yet in a terminal state (or whose last frame is unsent)."""
        return len(self._streams)

    @property
    def wants_to_send(self) -> bool:
        """True when :meth:`data_to_send` may have something to send."""
        return bool(self._control) or bool(self._ready)

    @property
    def going_away(self) -> bool:
        """True once a GOAWAY was sent or received: no new streams."""
        return self._goaway_sent is not None or self._goaway_received is not None

    def stream_state(self, stream_id: int) -> StreamState | None:
        """The state of a tracked stream, or None once it has ended."""
        stream = self._streams.get(stream_id)
        return None if stream is None else stream.state

    def stream_ids(self) -> list[int]:
        """Ids of the streams still tracked."""
        return list(self._streams)

    def send_capacity(self, stream_id: int) -> int:
        """How many more bytes :meth:`send_data` accepts on the stream now."""
        stream = self._streams.get(stream_id)
        if stream is None:
            return 0
        return max(0, self.limits.max_send_buffer - stream.pending_size)

    def send_window(self, stream_id: int = 0) -> int:
        """Credit this side holds on a stream, or on the connection (0)."""
        if stream_id == 0:
            return self._send_window
        stream = self._streams.get(stream_id)
        return 0 if stream is None else stream.send_window

    def pending_bytes(self, stream_id: int) -> int:
        """Bytes queued on the stream and not yet framed."""
        stream = self._streams.get(stream_id)
        return 0 if stream is None else stream.pending_size

    def deadline(self) -> float | None:
        """When :meth:`tick` must next be called, if the clock is running."""
        if self.state is ConnectionState.CLOSED:
            return None
        if self.state is ConnectionState.HANDSHAKE:
            return None if self._started is None else self._started + self.keepalive.timeout
        if self._keepalive_ping is not None and self._keepalive_ping in self._pings:
            return self._pings[self._keepalive_ping] + self.keepalive.timeout
        if self._last_received is None:
            return None
        return self._last_received + self.keepalive.interval

    # ----------------------------------------------------------------- commands

    def open_stream(
        self, kind: str, headers: Mapping[str, Any] | None = None, *, end_stream: bool = False
    ) -> int:
        """Open a stream and return its id. ``end_stream`` sends no data after it."""
        self._require_open()
        if self.going_away:
            raise GoingAwayError("the connection is going away; open the stream elsewhere")
        assert self.peer_limits is not None
        if self._local_open >= self.peer_limits.max_streams:
            raise StreamLimitError(
                f"the peer accepts at most {self.peer_limits.max_streams} concurrent streams"
            )
        kind_size = _kind_size(kind, "stream")
        header_map = dict(headers or {})
        size = _checked_size(header_map)
        if size > self.peer_limits.max_header_size:
            raise HeaderTooLargeError(
                f"headers of {size} bytes exceed the peer's limit of "
                f"{self.peer_limits.max_header_size}"
            )
        stream_id = self._next_stream_id
        if stream_id > MAX_STREAM_ID:
            raise StreamIdsExhaustedError("every stream id has been used; reconnect")
        self._next_stream_id += 2
        stream = Stream(
            stream_id,
            kind,
            local=True,
            send_window=self.peer_limits.initial_window,
            recv_window=self.limits.initial_window,
        )
        self._streams[stream_id] = stream
        self._local_open += 1
        self.stats.streams_opened += 1
        if end_stream:
            stream.state = StreamState.HALF_CLOSED_LOCAL
        self._control.append(
            (OpenFrame(stream_id, kind, header_map, end_stream), size + kind_size + _ENVELOPE)
        )
        return stream_id

    def send_data(
        self, stream_id: int, data: bytes | memoryview, *, end_stream: bool = False
    ) -> None:
        """Queue data on a stream; it is framed as credit allows.

        At most :meth:`send_capacity` bytes are accepted at once.
        """
        stream = self._streams.get(stream_id)
        if (
            stream is None
            or stream.state not in _SENDABLE
            or stream.pending_end
            or self.state is ConnectionState.CLOSED
        ):
            stream = self._writable_stream(stream_id, StreamInput.SEND_DATA)  # raises
        size = len(data)
        if size:
            if stream.pending_size + size > self.limits.max_send_buffer:
                raise SendBufferFullError(
                    f"stream {stream_id} has {stream.pending_size} bytes queued; "
                    f"wait until send_capacity() allows {size} more"
                )
            stream.pending.append(data)
            stream.pending_size += size
        if end_stream:
            self._send_end(stream)
        elif size and not stream.scheduled and stream.send_window > 0:
            stream.scheduled = True
            self._ready.append(stream)

    def end_stream(self, stream_id: int) -> None:
        """Half-close: this side sends no more data on the stream."""
        self._send_end(self._writable_stream(stream_id, StreamInput.SEND_END))

    def reset_stream(self, stream_id: int, code: int = ErrorCode.CANCEL, reason: str = "") -> None:
        """End a stream at once in both directions; queued data is dropped.

        Resetting a stream that has already ended does nothing, because the
        two sides may end a stream at the same moment.
        """
        _check_code(code)
        if self.state is ConnectionState.CLOSED:
            return
        stream = self._streams.get(stream_id)
        if stream is None:
            if not self._is_known(stream_id):
                raise UnknownStreamError(f"stream {stream_id} was never opened")
            return
        self._queue_reset(stream_id, code, reason)
        self._finish(stream, StreamState.RESET)

    def acknowledge_data(self, stream_id: int, size: int) -> None:
        """The consumer has taken ``size`` bytes of the stream: return their credit."""
        if size < 0:
            raise ValueError("size must not be negative")
        stream = self._streams.get(stream_id)
        if stream is None or size == 0:
            # The stream ended; its unacknowledged bytes were released then.
            return
        if size > stream.buffered:
            raise AcknowledgeError(
                f"acknowledged {size} bytes on stream {stream_id}, "
                f"but only {stream.buffered} are unacknowledged"
            )
        stream.buffered -= size
        self._buffered -= size
        state = stream.state
        if state is StreamState.OPEN or state is StreamState.HALF_CLOSED_LOCAL:
            stream.consumed += size
            if stream.consumed >= self._stream_threshold:
                increment = stream.consumed
                stream.consumed = 0
                stream.recv_window += increment
                self._control.append((WindowFrame(stream_id, increment), 24))
        if self._connection_window - self._recv_window >= self._connection_threshold:
            self._return_connection_credit()

    def send_message(self, kind: str, body: Mapping[str, Any]) -> None:
        """Send a connection-level control message; it jumps the data queue."""
        self._require_open()
        assert self.peer_limits is not None
        kind_size = _kind_size(kind, "message")
        body_map = dict(body)
        size = _checked_size(body_map)
        if size > self.peer_limits.max_header_size:
            raise HeaderTooLargeError(
                f"message body of {size} bytes exceeds the peer's limit of "
                f"{self.peer_limits.max_header_size}; send it on a stream"
            )
        self._control.append((MessageFrame(kind, body_map), size + kind_size + _ENVELOPE))

    def send_ping(self, now: float) -> int:
        """Send a PING; its PONG yields :class:`PongReceived` with the round trip."""
        self._require_open()
        opaque = self._next_ping
        self._next_ping += 1
        self._pings[opaque] = now
        if len(self._pings) > MAX_OUTSTANDING_PINGS:
            del self._pings[next(iter(self._pings))]
        self._control.append((PingFrame(opaque), 24))
        return opaque

    def goaway(self, code: int = ErrorCode.NO_ERROR, reason: str = "") -> None:
        """Accept no new streams from the peer; open ones may finish."""
        _check_code(code)
        if self.state is ConnectionState.CLOSED or self._goaway_sent is not None:
            return
        self._goaway_sent = self._highest_remote_id
        self._queue_goaway(code, reason)

    def close(self, code: int = ErrorCode.NO_ERROR, reason: str = "") -> None:
        """End the connection now: every stream is aborted, a last GOAWAY queued.

        Call it also when the socket is gone; the GOAWAY then goes nowhere.
        """
        _check_code(code)
        if self.state is ConnectionState.CLOSED:
            return
        if code == ErrorCode.NO_ERROR and self._streams:
            # Streams are aborted here, so the peer must abort its side too:
            # a NO_ERROR GOAWAY would let it wait for them (docs/protocol.md,
            # "Shutdown").
            code = ErrorCode.CANCEL
        self._control.clear()
        self._queue_goaway(code, reason)
        self._end_connection(code, reason)

    def tick(self, now: float) -> None:
        """Keep the connection alive: ping an idle peer, fail a silent one.

        Raises :class:`KeepaliveTimeoutError` (after queuing a GOAWAY) when the
        peer missed the deadline (docs/protocol.md, "Liveness").
        """
        if self.state is ConnectionState.CLOSED:
            return
        if self._started is None:
            self._started = now
        timeout = self.keepalive.timeout
        if self.state is ConnectionState.HANDSHAKE:
            if now - self._started >= timeout:
                self._fail_locally(
                    KeepaliveTimeoutError(f"the peer sent no HELLO within {timeout:g}s")
                )
            return
        if self._last_received is None:
            self._last_received = now
        if self._keepalive_ping is not None:
            sent = self._pings.get(self._keepalive_ping)
            if sent is None:
                self._keepalive_ping = None
            elif now - sent >= timeout:
                self._fail_locally(
                    KeepaliveTimeoutError(f"the peer did not answer a PING within {timeout:g}s")
                )
        if self._keepalive_ping is None and now - self._last_received >= self.keepalive.interval:
            self._keepalive_ping = self.send_ping(now)

    def data_to_send(self, max_messages: int | None = None) -> list[bytes]:
        """Messages to write to the WebSocket, in order (docs/protocol.md, "Scheduling").

        Control frames come first; then streams take turns, one frame each,
        as their credit and the connection's allow. ``max_messages`` lets the
        I/O layer pull only what the socket can take, so that a stream made
        ready later is not queued behind earlier bulk data.
        """
        if self.peer_limits is None:
            limit = MIN_FRAME_SIZE + MESSAGE_OVERHEAD
            max_payload = MIN_FRAME_SIZE
        else:
            limit = self.peer_limits.message_limit
            max_payload = self.peer_limits.max_frame_size
        can_send_data = self.state is not ConnectionState.CLOSED
        messages: list[bytes] = []
        while max_messages is None or len(messages) < max_messages:
            items: list[WireItem] = []
            size = 0
            control = self._control
            while control:
                frame, frame_size = control[0]
                if items and size + frame_size > limit:
                    break
                control.popleft()
                items.append(to_wire(frame))
                size += frame_size
            # DATA only once every control frame is out: control frames come
            # first, and a stream's OPEN must precede its DATA (docs/protocol.md,
            # "Scheduling").
            if can_send_data and self._ready and not control:
                size = self._schedule_data(items, size, limit, max_payload)
            if not items:
                break
            messages.append(encode_wire(items))
        self.stats.messages_sent += len(messages)
        return messages

    def receive_data(self, data: bytes, now: float) -> list[Event]:
        """Process one WebSocket message from the peer and return its events.

        A violation that ends the connection raises a
        :class:`RemoteProtocolError` after queuing a GOAWAY with its code:
        send what :meth:`data_to_send` returns, then close the socket.
        """
        if self.state is ConnectionState.CLOSED:
            raise ConnectionClosedError("the connection has ended")
        self._last_received = now
        self.stats.messages_received += 1
        events: list[Event] = []
        try:
            for frame in decode_message(data, self.limits):
                if self.closed:
                    break  # a GOAWAY with an error ended it mid-message
                if type(frame) is DataFrame:
                    self._receive_data_frame(frame, events)
                elif self.state is ConnectionState.HANDSHAKE:
                    self._receive_in_handshake(frame, events)
                elif type(frame) is WindowFrame:
                    self._receive_window(frame, events)
                elif type(frame) is OpenFrame:
                    self._receive_open(frame, events)
                elif type(frame) is ResetFrame:
                    self._receive_reset(frame, events)
                elif type(frame) is PingFrame:
                    if len(self._control) >= MAX_CONTROL_QUEUE:
                        raise ExcessiveLoadError("the peer sends PINGs faster than it reads")
                    self._control.append((PongFrame(frame.opaque), 24))
                elif type(frame) is PongFrame:
                    self._receive_pong(frame, now, events)
                elif type(frame) is MessageFrame:
                    self._receive_message(frame, events)
                elif type(frame) is GoAwayFrame:
                    self._receive_goaway(frame, events)
                else:
                    raise MalformedFrameError("HELLO after the handshake")
        except RemoteProtocolError as exc:
            self._fail(exc)
            raise
        return events

    # ------------------------------------------------------------ receive side

    def _receive_in_handshake(self, frame: Frame, events: list[Event]) -> None:
        if type(frame) is GoAwayFrame:
            self._receive_goaway(frame, events)
            return
        if type(frame) is not HelloFrame:
            raise MalformedFrameError(f"expected HELLO first, got {type(frame).__name__}")
        version = min(self._max_version, frame.max_version)
        if version < max(self._min_version, frame.min_version):
            raise UnsupportedVersionError(
                f"no protocol version in common: this side speaks "
                f"{self._min_version}-{self._max_version}, the peer "
                f"{frame.min_version}-{frame.max_version}; upgrade the older side"
            )
        self.version = version
        self.peer_limits = frame.limits
        self.peer_info = frame.info
        self.capabilities = self._local_capabilities & frame.capabilities
        self._send_window = frame.limits.connection_window
        self.state = ConnectionState.OPEN
        events.append(HandshakeCompleted(version, frame.limits, self.capabilities, frame.info))

    def _receive_data_frame(self, frame: DataFrame, events: list[Event]) -> None:
        if self.state is ConnectionState.HANDSHAKE:
            raise MalformedFrameError("expected HELLO first, got DATA")
        size = len(frame.data)
        if size > self._recv_window:
            raise FlowControlError(
                f"the peer sent {size} bytes with {self._recv_window} bytes of connection credit"
            )
        self._recv_window -= size
        self.stats.bytes_received += size
        stream = self._streams.get(frame.stream_id)
        if stream is None:
            # A stream that already ended: frames in flight are dropped, but
            # their connection credit is returned (docs/protocol.md, "Flow control").
            self._require_known(frame.stream_id, "DATA")
            self._return_connection_credit()
            return
        state = stream.state
        if state is not StreamState.OPEN and state is not StreamState.HALF_CLOSED_LOCAL:
            self._reset_for_violation(
                stream, ErrorCode.STREAM_CLOSED, "DATA after the end of the stream", events
            )
            self._return_connection_credit()
            return
        if size > stream.recv_window:
            self._reset_for_violation(
                stream, ErrorCode.FLOW_CONTROL_ERROR, "DATA beyond the stream's credit", events
            )
            self._return_connection_credit()
            return
        if size:
            stream.recv_window -= size
            stream.buffered += size
            self._buffered += size
            events.append(DataReceived(stream.id, frame.data))  # type: ignore[arg-type]
            # Cheap test first: nothing can be owed below the threshold.
            if self._connection_window - self._recv_window >= self._connection_threshold:
                self._return_connection_credit()
        if frame.end_stream:
            events.append(StreamEnded(stream.id))
            if state is StreamState.OPEN:
                stream.state = StreamState.HALF_CLOSED_REMOTE
            else:
                stream.state = StreamState.CLOSED
                if not stream.pending_end:
                    self._finish(stream, StreamState.CLOSED)

    def _receive_open(self, frame: OpenFrame, events: list[Event]) -> None:
        stream_id = frame.stream_id
        if stream_id % 2 != self._remote_parity:
            raise MalformedFrameError(f"the peer opened stream {stream_id}, an id of this side's")
        if stream_id <= self._highest_remote_id:
            raise MalformedFrameError(
                f"the peer opened stream {stream_id} after {self._highest_remote_id}; "
                "stream ids must increase"
            )
        self._highest_remote_id = stream_id
        if self._goaway_sent is not None:
            self._queue_reset(
                stream_id, ErrorCode.REFUSED_STREAM, "this side is going away", peer_caused=True
            )
            return
        if self._remote_open >= self.limits.max_streams:
            self._queue_reset(
                stream_id,
                ErrorCode.REFUSED_STREAM,
                f"too many concurrent streams (limit {self.limits.max_streams})",
                peer_caused=True,
            )
            return
        size = _packed_size(frame.headers)
        if size > self.limits.max_header_size:
            self._queue_reset(
                stream_id,
                ErrorCode.HEADER_TOO_LARGE,
                f"headers of {size} bytes exceed {self.limits.max_header_size}",
                peer_caused=True,
            )
            return
        assert self.peer_limits is not None
        stream = Stream(
            stream_id,
            frame.kind,
            local=False,
            send_window=self.peer_limits.initial_window,
            recv_window=self.limits.initial_window,
        )
        self._streams[stream_id] = stream
        self._remote_open += 1
        self.stats.streams_opened += 1
        events.append(StreamOpened(stream_id, frame.kind, frame.headers, frame.end_stream))
        if frame.end_stream:
            stream.state = StreamState.HALF_CLOSED_REMOTE
            events.append(StreamEnded(stream_id))

    def _receive_reset(self, frame: ResetFrame, events: list[Event]) -> None:
        stream = self._streams.get(frame.stream_id)
        if stream is None:
            self._require_known(frame.stream_id, "RESET")
            return
        self._finish(stream, StreamState.RESET)
        events.append(StreamReset(frame.stream_id, frame.code, frame.reason, remote=True))

    def _receive_window(self, frame: WindowFrame, events: list[Event]) -> None:
        if frame.stream_id == 0:
            if self._send_window + frame.increment > MAX_WINDOW:
                raise FlowControlError("the peer grew the connection window past 2**31-1")
            self._send_window += frame.increment
            return
        stream = self._streams.get(frame.stream_id)
        if stream is None:
            self._require_known(frame.stream_id, "WINDOW")
            return
        if stream.send_window + frame.increment > MAX_WINDOW:
            self._reset_for_violation(
                stream, ErrorCode.FLOW_CONTROL_ERROR, "stream window grown past 2**31-1", events
            )
            return
        stream.send_window += frame.increment
        if stream.pending_size and not stream.scheduled:
            stream.scheduled = True
            self._ready.append(stream)

    def _receive_pong(self, frame: PongFrame, now: float, events: list[Event]) -> None:
        sent = self._pings.pop(frame.opaque, None)
        if sent is None:
            return  # unsolicited or forgotten: harmless
        self.rtt = max(0.0, now - sent)
        events.append(PongReceived(frame.opaque, self.rtt))

    def _receive_message(self, frame: MessageFrame, events: list[Event]) -> None:
        # The body is bounded like an OPEN's headers (docs/protocol.md, "Limits"),
        # but belongs to no stream: over the limit, the connection fails.
        size = _packed_size(frame.body)
        if size > self.limits.max_header_size:
            raise FrameSizeError(
                f"MESSAGE body of {size} bytes exceeds the limit of {self.limits.max_header_size}",
                code=ErrorCode.HEADER_TOO_LARGE,
            )
        events.append(MessageReceived(frame.kind, frame.body))

    def _receive_goaway(self, frame: GoAwayFrame, events: list[Event]) -> None:
        last = frame.last_stream_id
        if self._goaway_received is not None:
            last = min(last, self._goaway_received)
        self._goaway_received = last
        events.append(GoAwayReceived(last, frame.code, frame.reason))
        if frame.code != ErrorCode.NO_ERROR:
            for stream in list(self._streams.values()):
                # Above ``last`` the peer never saw the stream: safe to retry.
                code = ErrorCode.REFUSED_STREAM if stream.local and stream.id > last else frame.code
                events.append(StreamReset(stream.id, code, frame.reason, remote=True))
            self._end_connection(frame.code, frame.reason or describe_code(frame.code))
            return
        # Streams this side opened above ``last`` were never seen: refused,
        # safe to retry on another connection (docs/protocol.md, "Shutdown").
        for stream in list(self._streams.values()):
            if stream.local and stream.id > last:
                self._finish(stream, StreamState.RESET)
                events.append(
                    StreamReset(
                        stream.id, ErrorCode.REFUSED_STREAM, "the peer is going away", remote=True
                    )
                )

    # --------------------------------------------------------------- send side

    def _schedule_data(self, items: list[WireItem], size: int, limit: int, max_payload: int) -> int:
        # The hot path of sending: credit and counters live in locals until the end.
        ready = self._ready
        room = limit - _DATA_OVERHEAD
        window = self._send_window
        sent = 0
        skipped = 0
        while ready and skipped < len(ready) and size < room:
            stream = ready.popleft()
            if stream.state is StreamState.RESET:
                stream.scheduled = False
                continue
            pending = stream.pending_size
            amount = stream.send_window
            if window < amount:
                amount = window
            if max_payload < amount:
                amount = max_payload
            if pending < amount:
                amount = pending
            if amount <= 0 and pending:
                if stream.send_window <= 0:
                    stream.scheduled = False  # back on the queue when WINDOW comes
                else:
                    ready.append(stream)  # waits for connection credit
                    skipped += 1
                continue
            if amount > room - size:
                if items:
                    ready.appendleft(stream)  # first in the next message
                    break
                amount = room - size
            skipped = 0
            data: bytes | memoryview = stream.take(amount) if amount else b""
            end = stream.pending_end and stream.pending_size == 0
            items.append(data_to_wire(stream.id, data, end))
            size += amount + _DATA_OVERHEAD
            stream.send_window -= amount
            window -= amount
            sent += amount
            if end:
                stream.pending_end = False
                stream.scheduled = False
                if stream.state is StreamState.CLOSED:
                    self._finish(stream, StreamState.CLOSED)
            elif stream.pending_size and stream.send_window > 0:
                ready.append(stream)
            else:
                stream.scheduled = False
        self._send_window = window
        self.stats.bytes_sent += sent
        return size

    def _send_end(self, stream: Stream) -> None:
        new_state = next_state(stream.state, StreamInput.SEND_END)
        if new_state is None:
            raise StreamStateError(f"cannot end stream {stream.id}: it is {stream.state.value}")
        stream.state = new_state
        stream.pending_end = True
        if not stream.scheduled:
            stream.scheduled = True
            self._ready.append(stream)

    def _writable_stream(self, stream_id: int, action: StreamInput) -> Stream:
        if self.state is ConnectionState.CLOSED:
            raise ConnectionClosedError("the connection has ended")
        stream = self._streams.get(stream_id)
        if stream is None:
            raise UnknownStreamError(f"stream {stream_id} is not open")
        if next_state(stream.state, action) is None or stream.pending_end:
            raise StreamStateError(
                f"cannot {action.value} on stream {stream_id}: it is {stream.state.value}"
            )
        return stream

    def _queue_reset(
        self, stream_id: int, code: int, reason: str, *, peer_caused: bool = False
    ) -> None:
        if peer_caused and len(self._control) >= MAX_CONTROL_QUEUE:
            # A peer that makes this side answer faster than it reads.
            raise ExcessiveLoadError("the peer causes RESETs faster than it reads them")
        reason = _short(reason)
        self._control.append((ResetFrame(stream_id, code, reason), 32 + 4 * len(reason)))

    def _queue_goaway(self, code: int, reason: str) -> None:
        reason = _short(reason)
        frame = GoAwayFrame(self._highest_remote_id, code, reason)
        self._control.append((frame, 32 + 4 * len(reason)))

    # ---------------------------------------------------------- flow and ends

    def _return_connection_credit(self) -> None:
        # Credit returns as soon as data is delivered, while the bytes held for
        # slow consumers stay within one connection window; past that, only as
        # they are acknowledged (docs/protocol.md, "Flow control").
        owed = self._connection_window - self._recv_window
        excess = self._buffered - self._connection_window
        if excess > 0:
            owed -= excess
        if owed >= self._connection_threshold:
            self._recv_window += owed
            self._control.append((WindowFrame(0, owed), 24))

    def _reset_for_violation(
        self, stream: Stream, code: ErrorCode, reason: str, events: list[Event]
    ) -> None:
        self._queue_reset(stream.id, code, reason, peer_caused=True)
        self._finish(stream, StreamState.RESET)
        events.append(StreamReset(stream.id, code, reason, remote=False))

    def _finish(self, stream: Stream, state: StreamState, *, aborted: bool = False) -> None:
        """Move a stream to its terminal state and stop tracking it."""
        stream.state = state
        stream.pending.clear()
        stream.pending_size = 0
        stream.pending_end = False
        del self._streams[stream.id]
        if stream.local:
            self._local_open -= 1
        else:
            self._remote_open -= 1
        if stream.buffered:
            self._buffered -= stream.buffered
            stream.buffered = 0
            if not aborted:
                # Its unacknowledged bytes are released: their connection credit
                # may be owed now, and a sender waiting only for it would
                # otherwise wait forever (docs/protocol.md, "Flow control").
                self._return_connection_credit()
        if aborted:
            self.stats.streams_aborted += 1
        elif state is StreamState.CLOSED:
            self.stats.streams_closed += 1
        else:
            self.stats.streams_reset += 1
        # A scheduled stream is dropped lazily by _schedule_data.

    def _end_connection(self, code: int, reason: str) -> None:
        for stream in list(self._streams.values()):
            self._finish(stream, StreamState.RESET, aborted=True)
        self._ready.clear()
        self.state = ConnectionState.CLOSED
        self.close_code = code
        self.close_reason = reason

    def _fail(self, error: RemoteProtocolError) -> None:
        if self.state is not ConnectionState.CLOSED:
            self.close(error.code, str(error))

    def _fail_locally(self, error: RemoteProtocolError) -> None:
        self._fail(error)
        raise error

    def _require_open(self) -> None:
        if self.state is ConnectionState.OPEN:
            return
        if self.state is ConnectionState.HANDSHAKE:
            raise HandshakeIncompleteError(
                "wait for HandshakeCompleted before using the connection"
            )
        raise ConnectionClosedError("the connection has ended")

    def _is_known(self, stream_id: int) -> bool:
        if stream_id % 2 == self._remote_parity:
            return 0 < stream_id <= self._highest_remote_id
        return 0 < stream_id < self._next_stream_id

    def _require_known(self, stream_id: int, name: str) -> None:
        if not self._is_known(stream_id):
            raise MalformedFrameError(f"{name} on stream {stream_id}, which was never opened")


def _packed_size(value: Mapping[str, Any]) -> int:
    """Encoded size of a map decoded from the peer (which always encodes again)."""
    return len(msgpack.packb(value))


def _checked_size(value: Mapping[str, Any]) -> int:
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


def _kind_size(kind: str, what: str) -> int:
    """Encoded length of a stream or message kind, after checking the peer accepts it."""
    if not 0 < len(kind) <= MAX_KIND_LENGTH:
        raise ValueError(f"{what} kind must have 1..{MAX_KIND_LENGTH} characters")
    try:
        return len(kind.encode())
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} kind must be valid Unicode text") from exc


def _check_code(code: int) -> None:
    if not 0 <= code < 2**32:
        raise ValueError(f"error code {code} is outside 0..2**32-1")


def _short(reason: str) -> str:
    if len(reason) > MAX_REASON_LENGTH:
        reason = reason[: MAX_REASON_LENGTH - 1] + "…"
    if not reason.isascii():
        # Lone surrogates cannot be sent; they must not break the connection.
        reason = reason.encode("utf-8", "replace").decode("utf-8")
    return reason
