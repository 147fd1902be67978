"""The sans-I/O connection: bytes in, events out; commands in, bytes out.

A :class:`Connection` is one side of one WebSocket. The I/O layer feeds it each
binary message with :meth:`Connection.receive_data` and acts on the events it
returns; it calls commands (:meth:`~Connection.open_stream`,
:meth:`~Connection.send_data` ...) and writes every message that
:meth:`~Connection.data_to_send` returns. Time enters as ``now`` arguments; the
connection never reads a clock, never blocks and never does I/O.

The rules it enforces are in docs/protocol.md; section names are cited below.
This module holds the class users see: its construction, queries and
commands, and the few internals every part shares (ending a stream, ending
the connection, returning connection credit). The rest lives beside it, one
concept per module, owned or called by the connection:

- ``outbox``: the send queues and the scheduler behind :meth:`~Connection.data_to_send`
  ("Messages and batching", "Scheduling");
- ``handlers``: what each received frame does, behind :meth:`~Connection.receive_data`;
- ``liveness``: PINGs, round trips and the keepalive clock ("Liveness");
- ``handshake``: this side's HELLO, and the negotiation ("Handshake", "Versioning");
- ``checks``: sizes, kinds, codes and reasons checked before frames are queued;
- ``state``: :class:`Side`, :class:`ConnectionState` and :class:`ConnectionStats`,
  importable from here as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .allowance import FRAME_ENVELOPE
from .checks import MAX_GROWTH, check_code, checked_kind_size, checked_size
from .errors import (
    AcknowledgeError,
    ConnectionClosedError,
    ErrorCode,
    GoingAwayError,
    HandshakeIncompleteError,
    HeaderTooLargeError,
    RemoteProtocolError,
    SendBufferFullError,
    StreamIdsExhaustedError,
    StreamLimitError,
    StreamStateError,
    UnknownStreamError,
)
from .events import Event
from .frames import MessageFrame, OpenFrame, PingFrame, WindowFrame, decode_message
from .handlers import handle_frames
from .handshake import hello_frame
from .limits import MAX_STREAM_ID, MESSAGE_OVERHEAD, MIN_FRAME_SIZE, Keepalive, Limits
from .liveness import MAX_OUTSTANDING_PINGS as MAX_OUTSTANDING_PINGS
from .liveness import Liveness
from .outbox import MAX_CONTROL_QUEUE as MAX_CONTROL_QUEUE
from .outbox import Outbox
from .sharing import SharedCredit
from .state import ConnectionState, ConnectionStats, Side
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

#: Room kept for an OPEN or MESSAGE frame's envelope, beyond its kind and map.
_ENVELOPE = 16
#: States that allow SEND_DATA, from the table: a tuple, because identity
#: comparison is much cheaper than hashing an enum on every write.
_SENDABLE = tuple(state for state, event in TRANSITIONS if event is StreamInput.SEND_DATA)


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
        stream_kinds: Iterable[str] | None = None,
        enforce_allowance: bool = True,
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

        hello, hello_size = hello_frame(versions, self.limits, capabilities, info)
        self._versions = (hello.min_version, hello.max_version)
        self._local_capabilities = hello.capabilities
        # Bytes queued, and dropped unsent, over the connection's life.
        self._queued_total = 0
        self._dropped_total = 0
        self._streams: dict[int, Stream] = {}
        self._local_open = 0
        self._remote_open = 0
        self._next_stream_id = 1 if side is Side.CLIENT else 2
        self._remote_parity = 0 if side is Side.CLIENT else 1
        self._highest_remote_id = 0
        # What is queued to send, and the connection credit to send DATA with.
        self._outbox = Outbox(self.stats)
        # Connection credit the peer still holds, out of the window this side grants.
        self._connection_window = self.limits.connection_window
        self._recv_window = self._connection_window
        # Bytes delivered to consumers and not yet acknowledged, all streams.
        self._buffered = 0
        # Stream credit targets: the window, or less while the connection is
        # shared (docs/protocol.md, "Sharing the connection").
        self._sharing = SharedCredit(self.limits)
        self._connection_threshold = max(1, self.limits.connection_window // 4)
        # Set per received message: it is too short to hold a map that
        # re-encodes over max_header_size (handlers' _open and _message).
        self._maps_fit = False
        self._goaway_sent: int | None = None
        self._goaway_received: int | None = None
        # The kinds of stream the peer may open; others are refused at once
        # (docs/protocol.md, "OPEN"). None takes every kind.
        self._stream_kinds = None if stream_kinds is None else frozenset(stream_kinds)
        # Whether a peer spending past its allowance ends the connection
        # (docs/protocol.md, "Frames without data").
        self._outbox.allowance.enforced = enforce_allowance
        self._liveness = Liveness(self.keepalive)
        self._outbox.control.append((hello, hello_size))

    # ------------------------------------------------------------------ queries

    def __repr__(self) -> str:
        return f"<Connection {self.side.value} {self.state.value} streams={len(self._streams)}>"

    @property
    def min_rtt(self) -> float | None:
        """Smallest round trip measured so far, in seconds (it sizes shared credit)."""
        return self._sharing.min_rtt

    @property
    def last_received(self) -> float | None:
        """When the peer's last message came (the ``now`` given with it); None before any."""
        return self._liveness.last_received

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
        outbox = self._outbox
        return bool(outbox.control) or bool(outbox.ready)

    @property
    def queued_frames(self) -> int:
        """Control frames, and streams with data or an END, waiting for :meth:`data_to_send`.

        How large the next batch is growing: the I/O layer may send it early.
        """
        outbox = self._outbox
        return len(outbox.control) + len(outbox.ready)

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
        """How many more bytes :meth:`send_data` accepts on the stream now.

        The least of the stream's room and the connection's (docs/protocol.md,
        "Limits": max_send_buffer, max_send_buffer_total).
        """
        stream = self._streams.get(stream_id)
        if stream is None:
            return 0
        stream_room = self.limits.max_send_buffer - stream.pending_size
        return max(0, min(stream_room, self.limits.max_send_buffer_total - self.queued_bytes))

    @property
    def queued_bytes(self) -> int:
        """Bytes queued on all streams and not yet framed."""
        return self._queued_total - self.stats.bytes_sent - self._dropped_total

    def send_window(self, stream_id: int = 0) -> int:
        """Credit this side holds on a stream, or on the connection (0)."""
        if stream_id == 0:
            return self._outbox.window
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
        return self._liveness.deadline(handshake=self.state is ConnectionState.HANDSHAKE)

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
        kind_size = checked_kind_size(kind, "stream")
        header_map = dict(headers or {})
        size = checked_size(header_map)
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
        self._sharing.recent.touch(stream_id, self.stats.bytes_received)
        self._local_open += 1
        self.stats.streams_opened += 1
        self._outbox.allowance.earn(2)  # the peer's RESET, a WINDOW
        if end_stream:
            stream.state = StreamState.HALF_CLOSED_LOCAL
        self._outbox.control.append(
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
            if size > self.send_capacity(stream_id):
                raise SendBufferFullError(
                    f"stream {stream_id} has {stream.pending_size} bytes queued "
                    f"({self.queued_bytes} on the connection); "
                    f"wait until send_capacity() allows {size} more"
                )
            stream.pending.append(data)
            stream.pending_size += size
            self._queued_total += size
        if end_stream:
            self._send_end(stream)
        elif size and not stream.scheduled and stream.send_window > 0:
            stream.scheduled = True
            self._outbox.ready.append(stream)

    def end_stream(self, stream_id: int) -> None:
        """Half-close: this side sends no more data on the stream."""
        self._send_end(self._writable_stream(stream_id, StreamInput.SEND_END))

    def reset_stream(self, stream_id: int, code: int = ErrorCode.CANCEL, reason: str = "") -> None:
        """End a stream at once in both directions; queued data is dropped.

        Resetting a stream that has already ended does nothing, because the
        two sides may end a stream at the same moment.
        """
        check_code(code)
        if self.state is ConnectionState.CLOSED:
            return
        stream = self._streams.get(stream_id)
        if stream is None:
            if not self._is_known(stream_id):
                raise UnknownStreamError(f"stream {stream_id} was never opened")
            return
        # Earns nothing: else a peer whose every stream this side refuses
        # (an agent opening reports without an id) could fund a flood with OPENs.
        self._outbox.queue_reset(stream_id, code, reason)
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
            self._return_stream_credit(stream)
        if self._connection_window - self._recv_window >= self._connection_threshold:
            self._return_connection_credit()

    def send_message(self, kind: str, body: Mapping[str, Any]) -> None:
        """Send a connection-level control message; it jumps the data queue."""
        self._require_open()
        assert self.peer_limits is not None
        kind_size = checked_kind_size(kind, "message")
        body_map = dict(body)
        size = checked_size(body_map)
        if size > self.peer_limits.max_header_size:
            raise HeaderTooLargeError(
                f"message body of {size} bytes exceeds the peer's limit of "
                f"{self.peer_limits.max_header_size}; send it on a stream"
            )
        self._outbox.control.append((MessageFrame(kind, body_map), size + kind_size + _ENVELOPE))
        self._outbox.allowance.earn(1)  # the peer may answer it

    def send_ping(self, now: float) -> int:
        """Send a PING; its PONG yields :class:`PongReceived` with the round trip."""
        self._require_open()
        opaque = self._liveness.ping(now)
        self._outbox.control.append((PingFrame(opaque), 24))
        self._outbox.allowance.earn(1)  # its PONG
        return opaque

    def probe(self, now: float) -> bool:
        """New work depends on the peer: PING it if it has been quiet (see :class:`Keepalive`).

        Call after opening a stream or queuing data or a message. True when a PING was
        queued; :meth:`deadline` may then be earlier than it was.
        """
        if self.state is not ConnectionState.OPEN or not self._liveness.probe_due(now):
            return False
        self._liveness.probe_ping = self.send_ping(now)
        return True

    def goaway(self, code: int = ErrorCode.NO_ERROR, reason: str = "") -> None:
        """Accept no new streams from the peer; open ones may finish."""
        check_code(code)
        if self.state is ConnectionState.CLOSED or self._goaway_sent is not None:
            return
        self._goaway_sent = self._highest_remote_id
        self._outbox.queue_goaway(self._highest_remote_id, code, reason)

    def close(self, code: int = ErrorCode.NO_ERROR, reason: str = "") -> None:
        """End the connection now: every stream is aborted, a last GOAWAY queued.

        Call it also when the socket is gone; the GOAWAY then goes nowhere.
        """
        check_code(code)
        if self.state is ConnectionState.CLOSED:
            return
        if code == ErrorCode.NO_ERROR and self._streams:
            # Streams are aborted here, so the peer must abort its side too:
            # a NO_ERROR GOAWAY would let it wait for them (docs/protocol.md,
            # "Shutdown").
            code = ErrorCode.CANCEL
        self._outbox.control.clear()
        self._outbox.queue_goaway(self._highest_remote_id, code, reason)
        self._end_connection(code, reason)

    def tick(self, now: float) -> None:
        """Keep the connection alive: ping an idle peer, fail a silent one.

        Raises :class:`KeepaliveTimeoutError` (after queuing a GOAWAY) when the
        peer missed the deadline (docs/protocol.md, "Liveness").
        """
        if self.state is ConnectionState.CLOSED:
            return
        liveness = self._liveness
        handshake = self.state is ConnectionState.HANDSHAKE
        error = liveness.missed(now, handshake=handshake)
        if error is not None:
            self._fail_locally(error)
        if not handshake and liveness.keepalive_due(now):
            liveness.keepalive_ping = self.send_ping(now)

    def data_to_send(self, max_messages: int | None = None) -> list[bytes]:
        """Messages to write to the WebSocket, in order (docs/protocol.md, "Scheduling").

        Control frames come first; then streams take turns, one frame each,
        as their credit and the connection's allow. ``max_messages`` lets the
        I/O layer pull only what the socket can take, so that a stream made
        ready later is not queued behind earlier bulk data.
        """
        outbox = self._outbox
        if not outbox.control and not outbox.ready:
            return []  # the I/O layer asks until nothing is left: answer that at once
        if self.peer_limits is None:
            limit = MIN_FRAME_SIZE + MESSAGE_OVERHEAD
            max_payload = MIN_FRAME_SIZE
        else:
            limit = self.peer_limits.message_limit
            max_payload = self.peer_limits.max_frame_size
        return outbox.messages(
            limit, max_payload, max_messages, self.state is not ConnectionState.CLOSED, self._finish
        )

    def receive_data(self, data: bytes, now: float) -> list[Event]:
        """Process one WebSocket message from the peer and return its events.

        A violation that ends the connection raises a
        :class:`RemoteProtocolError` after queuing a GOAWAY with its code:
        send what :meth:`data_to_send` returns, then close the socket.
        """
        if self.state is ConnectionState.CLOSED:
            raise ConnectionClosedError("the connection has ended")
        self._liveness.last_received = now
        self.stats.messages_received += 1
        events: list[Event] = []
        self._maps_fit = len(data) * MAX_GROWTH <= self.limits.max_header_size
        received = self.stats.bytes_received
        try:
            frames = decode_message(data, self.limits)
            handle_frames(self, frames, now, events)
            # A map of many small items costs a frame's worth per KiB to decode
            # and check: the rest of the message, past payload and envelopes.
            extra = len(data) - (self.stats.bytes_received - received)
            extra -= FRAME_ENVELOPE * len(frames)
            if extra >= 1024 and not self.closed:
                self._outbox.allowance.spend(now, extra >> 10)
        except RemoteProtocolError as exc:
            self._fail(exc)
            raise
        return events

    # ---------------------------------------------------------------- internals

    def _send_end(self, stream: Stream) -> None:
        new_state = next_state(stream.state, StreamInput.SEND_END)
        if new_state is None:
            raise StreamStateError(f"cannot end stream {stream.id}: it is {stream.state.value}")
        stream.state = new_state
        stream.pending_end = True
        if not stream.scheduled:
            stream.scheduled = True
            self._outbox.ready.append(stream)

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

    # ---------------------------------------------------------- flow and ends

    def _return_stream_credit(self, stream: Stream) -> None:
        # The peer may hold at most the target in credit (what queues ahead of
        # other streams), and credit plus unread bytes stay within the window
        # (what this side buffers); credit goes back once a quarter of the
        # target is owed (docs/protocol.md, "Flow control").
        sharing = self._sharing
        target, threshold = sharing.target(stream.id, self.stats.bytes_received)
        held = stream.recv_window
        owed = sharing.window - held - stream.buffered
        if target - held < owed:
            owed = target - held
        if owed >= threshold:
            stream.recv_window = held + owed
            self._outbox.control.append((WindowFrame(stream.id, owed), 24))

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
            self._outbox.control.append((WindowFrame(0, owed), 24))

    def _finish(self, stream: Stream, state: StreamState, *, aborted: bool = False) -> None:
        """Move a stream to its terminal state and stop tracking it."""
        stream.state = state
        stream.pending.clear()
        self._dropped_total += stream.pending_size
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
        # A scheduled stream is dropped lazily by the outbox's scheduler.

    def _end_connection(self, code: int, reason: str) -> None:
        for stream in list(self._streams.values()):
            self._finish(stream, StreamState.RESET, aborted=True)
        self._outbox.ready.clear()
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
