"""The send side of a connection: what is queued to go out, and the scheduler.

An :class:`Outbox` holds the two send queues of one
:class:`~protocol.connection.Connection` and the connection credit this side
may spend, and turns them into WebSocket messages for
:meth:`~protocol.connection.Connection.data_to_send`:

- control frames (every frame but DATA) go first, in the order they were
  queued, with a bound on their encoded size;
- then streams with data and credit take turns, one DATA frame each
  (docs/protocol.md, "Scheduling"), within the peer's frame size and message
  limit ("Messages and batching") and the stream's and the connection's
  credit ("Flow control").

The connection owns its outbox and queues into it directly; the outbox knows
streams only through the :class:`~protocol.streams.Stream` records it is given,
and holds no reference back to the connection (which is freed as soon as it is
dropped): what it needs of it, it is given per call.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from .allowance import ControlAllowance
from .checks import short_reason
from .errors import ExcessiveLoadError
from .frames import (
    Frame,
    GoAwayFrame,
    ResetFrame,
    WireItem,
    data_to_wire,
    encode_wire,
    to_wire,
)
from .state import ConnectionStats
from .streams import Stream, StreamState

__all__ = ["MAX_CONTROL_QUEUE", "Outbox"]

#: Control frames a peer may make this side queue (PONGs) before it is cut off.
MAX_CONTROL_QUEUE = 10_000
#: Room kept for a DATA frame's envelope when batching.
_DATA_OVERHEAD = 16

#: Ends a stream whose last frame has just been framed (``Connection._finish``).
_Finish = Callable[[Stream, StreamState], None]


class Outbox:
    """Frames waiting to be sent, and the connection credit to send DATA with."""

    __slots__ = ("_stats", "allowance", "control", "ready", "window")

    def __init__(self, stats: ConnectionStats) -> None:
        #: Control frames with their encoded size bound; they jump the data queue.
        self.control: deque[tuple[Frame, int]] = deque()
        #: Streams with data (or END) to send and credit to send it, round-robin.
        self.ready: deque[Stream] = deque()
        #: Connection credit this side may spend (docs/protocol.md, "Flow control").
        self.window = 0
        #: The frames without data the peer may send, earned by what this side sends.
        self.allowance = ControlAllowance()
        self._stats = stats

    def queue_reset(
        self, stream_id: int, code: int, reason: str, *, peer_caused: bool = False
    ) -> None:
        """Queue a RESET; one the peer caused counts against :data:`MAX_CONTROL_QUEUE`."""
        if peer_caused and len(self.control) >= MAX_CONTROL_QUEUE:
            # A peer that makes this side answer faster than it reads.
            raise ExcessiveLoadError("the peer causes RESETs faster than it reads them")
        reason = short_reason(reason)
        self.control.append((ResetFrame(stream_id, code, reason), 32 + 4 * len(reason)))

    def queue_goaway(self, last_stream_id: int, code: int, reason: str) -> None:
        """Queue a GOAWAY naming the last stream the peer opened that this side saw."""
        reason = short_reason(reason)
        frame = GoAwayFrame(last_stream_id, code, reason)
        self.control.append((frame, 32 + 4 * len(reason)))

    def messages(
        self,
        limit: int,
        max_payload: int,
        max_messages: int | None,
        with_data: bool,
        finish: _Finish,
    ) -> list[bytes]:
        """Encode what may go now into at most ``max_messages`` messages of ``limit`` bytes.

        DATA payloads are at most ``max_payload`` bytes; ``with_data`` is false
        once the connection has ended (only its last control frames go).
        ``finish`` ends a stream whose END went out after the peer's.
        """
        messages: list[bytes] = []
        while max_messages is None or len(messages) < max_messages:
            items: list[WireItem] = []
            size = 0
            control = self.control
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
            if with_data and self.ready and not control:
                size = self._schedule_data(items, size, limit, max_payload, finish)
            if not items:
                break
            messages.append(encode_wire(items))
        self._stats.messages_sent += len(messages)
        return messages

    def _schedule_data(
        self, items: list[WireItem], size: int, limit: int, max_payload: int, finish: _Finish
    ) -> int:
        # The hot path of sending: credit and counters live in locals until the end.
        ready = self.ready
        room = limit - _DATA_OVERHEAD
        window = self.window
        sent = 0
        frames = 0
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
            frames += 1
            size += amount + _DATA_OVERHEAD
            stream.send_window -= amount
            window -= amount
            sent += amount
            if end:
                stream.pending_end = False
                stream.scheduled = False
                if stream.state is StreamState.CLOSED:
                    finish(stream, StreamState.CLOSED)
            elif stream.pending_size and stream.send_window > 0:
                ready.append(stream)
            else:
                stream.scheduled = False
        self.window = window
        self._stats.bytes_sent += sent
        if frames:
            # The peer may answer with WINDOWs: one per quarter of its credit
            # target that it reads (so up to five per frame), or per KiB when
            # its target is under 4 KiB; and RESETs.
            self.allowance.earn(6 * frames + (sent >> 10))
        return size
