"""Stream states and the transition table (docs/protocol.md, "Stream states").

Every stream starts OPEN and ends in exactly one terminal state: CLOSED (both
directions ended cleanly) or RESET (either side reset it, or the connection
ended under it)::

                      OPEN
          send END  /      \\  recv END
                   v        v
     HALF_CLOSED_LOCAL    HALF_CLOSED_REMOTE
          recv END  \\      /  send END
                     v    v
                     CLOSED

    send RESET or recv RESET from any non-terminal state -> RESET

A (state, input) pair missing from :data:`TRANSITIONS` is an error: a local
input raises :class:`StreamStateError` and sends nothing; a remote input is a
peer's violation, answered by resetting the stream with STREAM_CLOSED.
"""

from __future__ import annotations

import enum
from collections import deque

__all__ = [
    "TERMINAL_STATES",
    "TRANSITIONS",
    "Stream",
    "StreamInput",
    "StreamState",
    "next_state",
]


class StreamState(enum.Enum):
    OPEN = "open"
    HALF_CLOSED_LOCAL = "half-closed (local)"
    HALF_CLOSED_REMOTE = "half-closed (remote)"
    CLOSED = "closed"
    RESET = "reset"

    # Members are singletons, so identity hashes them as well as Enum's own
    # __hash__, and in C: transitions are looked up by (state, input) on
    # every request.
    __hash__ = object.__hash__


class StreamInput(enum.Enum):
    SEND_DATA = "send DATA"
    SEND_END = "send END"
    SEND_RESET = "send RESET"
    RECV_DATA = "receive DATA"
    RECV_END = "receive END"
    RECV_RESET = "receive RESET"

    __hash__ = object.__hash__  # as StreamState's

    @property
    def is_local(self) -> bool:
        return self.name.startswith("SEND")


_S = StreamState
_I = StreamInput

TRANSITIONS: dict[tuple[StreamState, StreamInput], StreamState] = {
    (_S.OPEN, _I.SEND_DATA): _S.OPEN,
    (_S.OPEN, _I.RECV_DATA): _S.OPEN,
    (_S.OPEN, _I.SEND_END): _S.HALF_CLOSED_LOCAL,
    (_S.OPEN, _I.RECV_END): _S.HALF_CLOSED_REMOTE,
    (_S.OPEN, _I.SEND_RESET): _S.RESET,
    (_S.OPEN, _I.RECV_RESET): _S.RESET,
    (_S.HALF_CLOSED_LOCAL, _I.RECV_DATA): _S.HALF_CLOSED_LOCAL,
    (_S.HALF_CLOSED_LOCAL, _I.RECV_END): _S.CLOSED,
    (_S.HALF_CLOSED_LOCAL, _I.SEND_RESET): _S.RESET,
    (_S.HALF_CLOSED_LOCAL, _I.RECV_RESET): _S.RESET,
    (_S.HALF_CLOSED_REMOTE, _I.SEND_DATA): _S.HALF_CLOSED_REMOTE,
    (_S.HALF_CLOSED_REMOTE, _I.SEND_END): _S.CLOSED,
    (_S.HALF_CLOSED_REMOTE, _I.SEND_RESET): _S.RESET,
    (_S.HALF_CLOSED_REMOTE, _I.RECV_RESET): _S.RESET,
    # A CLOSED stream may still hold its own END in the send queue; a RESET
    # then discards it. Frames that cross on the wire after a stream ended
    # are handled by the connection, which no longer tracks the stream.
    (_S.CLOSED, _I.SEND_RESET): _S.RESET,
    (_S.CLOSED, _I.RECV_RESET): _S.RESET,
}

TERMINAL_STATES = frozenset({StreamState.CLOSED, StreamState.RESET})


def next_state(state: StreamState, event: StreamInput) -> StreamState | None:
    """The state after ``event``, or None when the table has no such transition."""
    return TRANSITIONS.get((state, event))


class Stream:
    """One stream's state, credit and send queue, as the connection tracks it."""

    __slots__ = (
        "buffered",
        "id",
        "kind",
        "local",
        "pending",
        "pending_end",
        "pending_size",
        "recv_window",
        "scheduled",
        "send_window",
        "state",
    )

    def __init__(
        self, stream_id: int, kind: str, *, local: bool, send_window: int, recv_window: int
    ) -> None:
        self.id = stream_id
        self.kind = kind
        #: Opened by this side.
        self.local = local
        self.state = StreamState.OPEN
        #: Credit this side may still send on the stream.
        self.send_window = send_window
        #: Credit the peer still holds on the stream.
        self.recv_window = recv_window
        #: Delivered to the consumer, not yet acknowledged.
        self.buffered = 0
        #: Data waiting for credit and its turn, and whether END follows it.
        self.pending: deque[bytes | memoryview] = deque()
        self.pending_size = 0
        self.pending_end = False
        #: In the scheduler's round-robin queue.
        self.scheduled = False

    def __repr__(self) -> str:
        return f"<Stream {self.id} {self.kind} {self.state.value}>"

    def take(self, size: int) -> bytes | memoryview:
        """Remove and return exactly ``size`` bytes (at most ``pending_size``) from the queue.

        Exactly: the caller has charged ``size`` bytes of credit for them.
        """
        pending = self.pending
        head = pending[0]
        length = len(head)
        if length == size:
            pending.popleft()
        elif length > size:
            view = memoryview(head)
            pending[0] = view[size:]
            head = view[:size]
        else:
            pending.popleft()
            parts = [head]
            while length < size and pending:
                chunk = pending[0]
                wanted = size - length
                if len(chunk) <= wanted:
                    pending.popleft()
                else:
                    view = memoryview(chunk)
                    pending[0] = view[wanted:]
                    chunk = view[:wanted]
                parts.append(chunk)
                length += len(chunk)
            head = b"".join(parts)
            size = length
        self.pending_size -= size
        return head
