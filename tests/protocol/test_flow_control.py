"""Flow control: per-stream and per-connection credit, and peers that overrun it."""

from __future__ import annotations

import pytest

from protocol import (
    AcknowledgeError,
    DataReceived,
    ErrorCode,
    FlowControlError,
    Limits,
    SendBufferFullError,
    Side,
    StreamReset,
    StreamState,
)
from protocol.connection import Connection
from protocol.events import Event
from protocol.frames import DataFrame, GoAwayFrame, OpenFrame, ResetFrame, WindowFrame
from protocol.limits import MAX_WINDOW

from .pair import Pair, assert_accounted, feed, handshaken, of_type, sent_frames


def delivered(events: list[Event], stream_id: int | None = None) -> int:
    return sum(
        len(e.data)
        for e in of_type(events, DataReceived)
        if stream_id is None or e.stream_id == stream_id
    )


def acknowledge_all(connection: Connection, events: list[Event]) -> None:
    for event in of_type(events, DataReceived):
        connection.acknowledge_data(event.stream_id, len(event.data))


def test_stream_credit_returns_only_when_the_consumer_acknowledges() -> None:
    pair = Pair(server=Connection(Side.SERVER, Limits(initial_window=4096)))
    stream_id = pair.client.open_stream("http")
    pair.client.send_data(stream_id, b"x" * 10_000)

    _, server_events = pair.exchange()

    assert delivered(server_events) == 4096
    assert pair.client.send_window(stream_id) == 0
    assert pair.client.pending_bytes(stream_id) == 10_000 - 4096
    # Nothing the consumer has not taken is credited back, however often we talk.
    assert pair.exchange() == ([], [])

    pair.server.acknowledge_data(stream_id, 4096)
    [window] = [f for f in sent_frames(pair.server) if isinstance(f, WindowFrame)]
    assert window == WindowFrame(stream_id, 4096)


def test_acknowledged_data_lets_the_rest_through() -> None:
    pair = Pair(server=Connection(Side.SERVER, Limits(initial_window=4096)))
    stream_id = pair.client.open_stream("http")
    pair.client.send_data(stream_id, b"x" * 10_000, end_stream=True)

    total = 0
    for _ in range(10):
        _, server_events = pair.exchange()
        total += delivered(server_events)
        acknowledge_all(pair.server, server_events)

    assert total == 10_000
    assert pair.server.stream_state(stream_id) is StreamState.HALF_CLOSED_REMOTE


def test_small_acknowledgements_are_batched_into_one_window() -> None:
    # Credit goes back once a quarter of the window is consumed, not per byte.
    pair = Pair(server=Connection(Side.SERVER, Limits(initial_window=4000)))
    stream_id = pair.client.open_stream("http")
    pair.client.send_data(stream_id, b"x" * 4000)
    pair.exchange()

    pair.server.acknowledge_data(stream_id, 999)
    assert of_type(sent_frames(pair.server), WindowFrame) == []
    pair.server.acknowledge_data(stream_id, 1)
    assert of_type(sent_frames(pair.server), WindowFrame) == [WindowFrame(stream_id, 1000)]


def test_connection_credit_bounds_the_unacknowledged_bytes_of_all_streams() -> None:
    # Connection credit returns on delivery while the bytes held for consumers
    # stay within one connection window; past that, only as they are acknowledged.
    server = Connection(Side.SERVER, Limits(connection_window=10_000, initial_window=100_000))
    pair = Pair(server=server)
    stream_ids = [pair.client.open_stream("http") for _ in range(3)]
    for stream_id in stream_ids:
        pair.client.send_data(stream_id, b"x" * 20_000)

    _, server_events = pair.exchange()

    assert delivered(server_events) == 20_000
    assert pair.client.send_window(0) == 0
    assert sum(pair.client.pending_bytes(i) for i in stream_ids) == 40_000

    total = delivered(server_events)
    for _ in range(20):
        acknowledge_all(pair.server, server_events)
        _, server_events = pair.exchange()
        total += delivered(server_events)
    assert total == 60_000


def test_connection_credit_of_a_reset_stream_comes_back() -> None:
    # Bytes held for a stream that then ends are released with it; their
    # connection credit must come back or every other stream would starve.
    server = Connection(Side.SERVER, Limits(connection_window=1000, initial_window=5000))
    pair = Pair(server=server)
    stalled = pair.client.open_stream("http")
    pair.client.send_data(stalled, b"x" * 3000)
    pair.exchange()
    assert pair.client.send_window(0) == 0

    pair.server.reset_stream(stalled)
    other = pair.client.open_stream("http")
    pair.client.send_data(other, b"y" * 10)
    _, server_events = pair.exchange()

    assert delivered(server_events, other) == 10


def test_peer_beyond_stream_credit_gets_that_stream_reset() -> None:
    server = handshaken(limits=Limits(initial_window=1024))
    feed(server, OpenFrame(1, "http", {}), OpenFrame(3, "http", {}))

    events = feed(server, DataFrame(1, b"x" * 1000), DataFrame(1, b"x" * 25))

    assert of_type(events, StreamReset) == [
        StreamReset(
            1, ErrorCode.FLOW_CONTROL_ERROR, "DATA beyond the stream's credit", remote=False
        )
    ]
    assert delivered(events, 1) == 1000
    frames = sent_frames(server)
    assert ResetFrame(1, ErrorCode.FLOW_CONTROL_ERROR, "DATA beyond the stream's credit") in frames
    # Only that stream: the connection and its other streams carry on.
    assert not server.closed
    assert server.stream_state(3) is StreamState.OPEN
    assert delivered(feed(server, DataFrame(3, b"ok"))) == 2
    assert_accounted(server)


def test_peer_beyond_connection_credit_ends_the_connection() -> None:
    server = handshaken(limits=Limits(connection_window=1024))
    feed(server, OpenFrame(1, "http", {}))

    with pytest.raises(FlowControlError) as error:
        feed(server, DataFrame(1, b"x" * 1025))

    assert error.value.code is ErrorCode.FLOW_CONTROL_ERROR
    assert server.closed
    assert server.stats.streams_aborted == 1
    [goaway] = sent_frames(server)
    assert isinstance(goaway, GoAwayFrame)
    assert goaway.code == ErrorCode.FLOW_CONTROL_ERROR
    assert goaway.last_stream_id == 1


def test_delivered_data_returns_connection_credit_once_a_quarter_is_owed() -> None:
    server = handshaken(limits=Limits(connection_window=1000))
    feed(server, OpenFrame(1, "http", {}))

    feed(server, DataFrame(1, b"x" * 200))
    assert of_type(sent_frames(server), WindowFrame) == []  # 200 < 1000 // 4

    feed(server, DataFrame(1, b"x" * 100))
    assert of_type(sent_frames(server), WindowFrame) == [WindowFrame(0, 300)]


def test_window_growing_a_stream_past_the_maximum_resets_it() -> None:
    server = handshaken()
    feed(server, OpenFrame(1, "http", {}))

    events = feed(server, WindowFrame(1, MAX_WINDOW))

    [reset] = of_type(events, StreamReset)
    assert (reset.stream_id, reset.code, reset.remote) == (1, ErrorCode.FLOW_CONTROL_ERROR, False)
    assert ResetFrame(1, ErrorCode.FLOW_CONTROL_ERROR, reset.reason) in sent_frames(server)
    assert not server.closed


def test_window_growing_the_connection_past_the_maximum_ends_it() -> None:
    server = handshaken()

    with pytest.raises(FlowControlError):
        feed(server, WindowFrame(0, MAX_WINDOW))

    [goaway] = sent_frames(server)
    assert isinstance(goaway, GoAwayFrame)
    assert goaway.code == ErrorCode.FLOW_CONTROL_ERROR


def test_window_frames_add_to_the_credit() -> None:
    client = handshaken(Side.CLIENT, peer_limits=Limits(initial_window=100))
    stream_id = client.open_stream("http")

    feed(client, WindowFrame(stream_id, 50), WindowFrame(0, 7))

    assert client.send_window(stream_id) == 150
    assert client.send_window(0) == Limits().connection_window + 7


def test_acknowledging_more_than_was_delivered_raises() -> None:
    pair = Pair()
    stream_id = pair.client.open_stream("http")
    pair.client.send_data(stream_id, b"abc")
    pair.exchange()

    with pytest.raises(AcknowledgeError) as error:
        pair.server.acknowledge_data(stream_id, 4)
    assert error.value.code is ErrorCode.FLOW_CONTROL_ERROR
    with pytest.raises(ValueError, match="negative"):
        pair.server.acknowledge_data(stream_id, -1)
    pair.server.acknowledge_data(stream_id, 3)


def test_send_buffer_is_bounded_per_stream() -> None:
    client = handshaken(Side.CLIENT, Limits(max_send_buffer=1000))
    stream_id = client.open_stream("http")

    client.send_data(stream_id, b"x" * 600)

    assert client.send_capacity(stream_id) == 400
    with pytest.raises(SendBufferFullError) as error:
        client.send_data(stream_id, b"x" * 401)
    assert error.value.code is ErrorCode.FLOW_CONTROL_ERROR
    client.send_data(stream_id, b"x" * 400)
    assert client.send_capacity(stream_id) == 0


def test_data_for_an_ended_stream_still_returns_connection_credit() -> None:
    server = handshaken(limits=Limits(connection_window=1000))
    feed(server, OpenFrame(1, "http", {}))
    server.reset_stream(1)
    sent_frames(server)

    events = feed(server, DataFrame(1, b"x" * 900))

    assert events == []
    assert of_type(sent_frames(server), WindowFrame) == [WindowFrame(0, 900)]
