"""Random interleavings of commands and deliveries between two endpoints.

Hypothesis plays both applications and the wire: it opens streams, writes,
half-closes, resets, acknowledges, pulls messages and delivers them in any
order the protocol allows (each direction stays in order, as on a WebSocket).
Whatever it does, every byte of every stream that was not reset arrives
exactly once and in order, no honest peer is ever accused of breaking the
protocol, and once both sides end their streams and drain the wire, neither
side holds a stream.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import (
    Connection,
    DataReceived,
    Limits,
    Side,
    StreamEnded,
    StreamLimitError,
    StreamOpened,
    StreamReset,
    StreamState,
)
from protocol.events import Event
from protocol.limits import MIN_FRAME_SIZE

from .pair import assert_accounted

#: Small windows and buffers, so that credit runs out often.
LIMITS = Limits(
    max_frame_size=MIN_FRAME_SIZE,
    max_header_size=1024,
    max_streams=6,
    initial_window=2000,
    connection_window=2500,
    max_send_buffer=5000,
)
#: Application reset codes; the protocol's own codes would mean a violation.
APP_CODE = 0x100
WRITABLE = (StreamState.OPEN, StreamState.HALF_CLOSED_REMOTE)


@dataclass
class Endpoint:
    """One side: its connection, its outgoing wire, and what its application saw."""

    connection: Connection
    wire: list[bytes] = field(default_factory=list)
    written: dict[int, bytearray] = field(default_factory=dict)
    received: dict[int, bytearray] = field(default_factory=dict)
    unacknowledged: dict[int, int] = field(default_factory=dict)
    ended: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class Op:
    """One step: ``name`` on endpoint ``side`` with small integer arguments."""

    name: str
    side: int
    pick: int
    size: int
    flag: bool


#: How often each step is drawn, relative to the others.
WEIGHTS = {"open": 2, "send": 3, "end": 1, "reset": 1, "ack": 2, "pull": 2, "deliver": 3, "ping": 1}

OPS = st.builds(
    Op,
    name=st.sampled_from([name for name, weight in WEIGHTS.items() for _ in range(weight)]),
    side=st.integers(0, 1),
    pick=st.integers(0, 31),
    size=st.one_of(st.integers(0, 64), st.integers(500, 3000)),
    flag=st.booleans(),
)


class World:
    """Two endpoints, the wire between them, and the bookkeeping to judge them."""

    def __init__(self) -> None:
        self.endpoints = (
            Endpoint(Connection(Side.CLIENT, LIMITS)),
            Endpoint(Connection(Side.SERVER, LIMITS)),
        )
        self.now = 0.0
        self.reset: set[int] = set()
        self.accusations: list[StreamReset] = []
        self.sources: dict[tuple[int, Side], random.Random] = {}
        self.drain()
        # Two streams from each side, their OPENs not yet sent: something to work on.
        for side in (0, 1):
            for _ in range(2):
                self.open(self.endpoints[side], Op("open", side, 1, 0, False))

    def peer(self, side: int) -> Endpoint:
        return self.endpoints[1 - side]

    # -- the applications

    def track(self, endpoint: Endpoint, stream_id: int) -> None:
        endpoint.written[stream_id] = bytearray()
        endpoint.received[stream_id] = bytearray()
        endpoint.unacknowledged[stream_id] = 0

    def pick(self, endpoint: Endpoint, op: Op, states: tuple[StreamState, ...]) -> int | None:
        connection = endpoint.connection
        ids = sorted(i for i in connection.stream_ids() if connection.stream_state(i) in states)
        return ids[op.pick % len(ids)] if ids else None

    def open(self, endpoint: Endpoint, op: Op) -> None:
        # Mostly streams with something to say: one in eight is opened already ended.
        end_stream = op.flag and op.pick % 4 == 0
        try:
            stream_id = endpoint.connection.open_stream(
                "test", {"n": op.size}, end_stream=end_stream
            )
        except StreamLimitError:
            return
        self.track(endpoint, stream_id)

    def send(self, endpoint: Endpoint, op: Op) -> None:
        stream_id = self.pick(endpoint, op, WRITABLE)
        if stream_id is None:
            return
        connection = endpoint.connection
        size = min(op.size, connection.send_capacity(stream_id))
        # Each direction of each stream has its own byte source: nothing repeats.
        key = (stream_id, connection.side)
        data = self.sources.setdefault(key, random.Random(str(key))).randbytes(size)
        connection.send_data(stream_id, data, end_stream=op.flag and op.pick % 4 == 0)
        endpoint.written[stream_id] += data

    def end(self, endpoint: Endpoint, op: Op) -> None:
        stream_id = self.pick(endpoint, op, WRITABLE)
        if stream_id is not None:
            endpoint.connection.end_stream(stream_id)

    def reset_stream(self, endpoint: Endpoint, op: Op) -> None:
        stream_id = self.pick(endpoint, op, tuple(StreamState))
        if stream_id is not None:
            endpoint.connection.reset_stream(stream_id, APP_CODE + op.pick, "test")
            self.reset.add(stream_id)

    def acknowledge(self, endpoint: Endpoint, op: Op) -> None:
        owed = sorted(i for i, size in endpoint.unacknowledged.items() if size)
        if not owed:
            return
        stream_id = owed[op.pick % len(owed)]
        size = min(op.size, endpoint.unacknowledged[stream_id]) or 1
        endpoint.connection.acknowledge_data(stream_id, size)
        endpoint.unacknowledged[stream_id] -= size

    # -- the wire

    def pull(self, endpoint: Endpoint, max_messages: int | None) -> int:
        messages = endpoint.connection.data_to_send(max_messages)
        limit = self.peer(self.endpoints.index(endpoint)).connection.limits.message_limit
        assert all(len(message) <= limit for message in messages)
        endpoint.wire.extend(messages)
        return len(messages)

    def deliver(self, side: int, count: int | None) -> int:
        source = self.endpoints[side]
        target = self.peer(side)
        batch = source.wire[:count] if count is not None else list(source.wire)
        del source.wire[: len(batch)]
        for message in batch:
            self.observe(target, target.connection.receive_data(message, self.now))
        return len(batch)

    def observe(self, endpoint: Endpoint, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, StreamOpened):
                self.track(endpoint, event.stream_id)
            elif isinstance(event, DataReceived):
                endpoint.received[event.stream_id] += event.data
                endpoint.unacknowledged[event.stream_id] += len(event.data)
            elif isinstance(event, StreamEnded):
                assert event.stream_id not in endpoint.ended
                endpoint.ended.add(event.stream_id)
            elif isinstance(event, StreamReset):
                self.reset.add(event.stream_id)
                endpoint.unacknowledged[event.stream_id] = 0
                if not event.remote or event.code < APP_CODE:
                    self.accusations.append(event)

    # -- driving

    def step(self, op: Op) -> None:
        endpoint = self.endpoints[op.side]
        self.now += 0.001
        if op.name == "open":
            self.open(endpoint, op)
        elif op.name == "send":
            self.send(endpoint, op)
        elif op.name == "end":
            self.end(endpoint, op)
        elif op.name == "reset":
            self.reset_stream(endpoint, op)
        elif op.name == "ack":
            self.acknowledge(endpoint, op)
        elif op.name == "pull":
            self.pull(endpoint, op.pick % 3 or None)
        elif op.name == "deliver":
            self.deliver(op.side, op.pick % 4 + 1)
        else:
            endpoint.connection.send_ping(self.now)
        assert_accounted(*(e.connection for e in self.endpoints))

    def drain(self) -> None:
        """Carry everything across, acknowledging all that arrives, until both are quiet."""
        for _ in range(10_000):
            moved = sum(self.pull(endpoint, None) for endpoint in self.endpoints)
            moved += sum(self.deliver(side, None) for side in (0, 1))
            for endpoint in self.endpoints:
                for stream_id, size in endpoint.unacknowledged.items():
                    if size:
                        endpoint.connection.acknowledge_data(stream_id, size)
                        endpoint.unacknowledged[stream_id] = 0
            if not moved:
                return
        raise AssertionError("the endpoints never fell quiet")

    def finish(self) -> None:
        """Both applications end every stream they may still write; the wire drains.

        A stream whose OPEN was still on the wire shows up only after a drain,
        so ending and draining go on until nothing is left to end.
        """
        self.drain()
        for _ in range(10):
            writable = [
                (endpoint.connection, stream_id)
                for endpoint in self.endpoints
                for stream_id in endpoint.connection.stream_ids()
                if endpoint.connection.stream_state(stream_id) in WRITABLE
            ]
            if not writable:
                return
            for connection, stream_id in writable:
                connection.end_stream(stream_id)
            self.drain()
        raise AssertionError("streams kept reopening")


@settings(
    max_examples=1000,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(ops=st.lists(OPS, min_size=20, max_size=150))
def test_every_byte_of_every_stream_arrives_once_in_order(ops: list[Op]) -> None:
    world = World()

    for op in ops:
        world.step(op)
    world.finish()

    assert world.accusations == []
    for side, endpoint in enumerate(world.endpoints):
        peer = world.peer(side)
        for stream_id, written in endpoint.written.items():
            arrived = peer.received.get(stream_id, bytearray())
            if stream_id in world.reset:
                assert written.startswith(arrived), stream_id
            else:
                assert arrived == written, stream_id
                assert stream_id in peer.ended
    for side, endpoint in enumerate(world.endpoints):
        # No credit leaks: with nothing held, all but a batching quarter came back.
        window = world.peer(side).connection.limits.connection_window
        assert endpoint.connection.send_window(0) > window - window // 4
        assert endpoint.connection.open_streams == 0
        assert endpoint.connection.stream_ids() == []
        assert not endpoint.connection.closed
        assert_accounted(endpoint.connection)
