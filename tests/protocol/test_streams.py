"""Streams: opening, data, half-close each way, reset, ids, and their accounting."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from protocol import (
    ConnectionClosedError,
    DataReceived,
    ErrorCode,
    MalformedFrameError,
    Side,
    StreamEnded,
    StreamOpened,
    StreamReset,
    StreamState,
    StreamStateError,
    UnknownStreamError,
)
from protocol.events import Event
from protocol.frames import MAX_REASON_LENGTH, DataFrame, GoAwayFrame, OpenFrame, ResetFrame

from .pair import Pair, assert_accounted, data_frames, feed, handshaken, of_type, sent_frames


def received(events: Sequence[Event], stream_id: int) -> bytes:
    """The bytes delivered on one stream, in order."""
    return b"".join(e.data for e in of_type(events, DataReceived) if e.stream_id == stream_id)


def test_open_stream_delivers_its_kind_and_headers() -> None:
    pair = Pair()
    headers = {"command": ["ls", "-l"], "tty": False, "env": {"A": "1"}}

    stream_id = pair.client.open_stream("command", headers)
    events = pair.send(pair.client)

    assert events == [StreamOpened(stream_id, "command", headers)]
    assert pair.server.stream_state(stream_id) is StreamState.OPEN
    assert pair.client.stream_state(stream_id) is StreamState.OPEN


def test_data_arrives_in_order_on_both_directions() -> None:
    pair = Pair()
    stream_id = pair.client.open_stream("http")
    for chunk in (b"GET ", b"/api", b"/v1"):
        pair.client.send_data(stream_id, chunk)
    server_events = pair.send(pair.client)
    pair.server.send_data(stream_id, b"200 ")
    pair.server.send_data(stream_id, b"OK")

    client_events, _ = pair.exchange()

    assert received(server_events, stream_id) == b"GET /api/v1"
    assert received(client_events, stream_id) == b"200 OK"


def test_client_stream_ids_are_odd_and_server_ids_even() -> None:
    pair = Pair()

    client_ids = [pair.client.open_stream("http") for _ in range(3)]
    server_ids = [pair.server.open_stream("command") for _ in range(3)]
    client_events, server_events = pair.exchange()

    assert client_ids == [1, 3, 5]
    assert server_ids == [2, 4, 6]
    assert [e.stream_id for e in of_type(server_events, StreamOpened)] == client_ids
    assert [e.stream_id for e in of_type(client_events, StreamOpened)] == server_ids
    assert (
        sorted(pair.client.stream_ids()) == sorted(pair.server.stream_ids()) == [1, 2, 3, 4, 5, 6]
    )


@pytest.mark.parametrize(("side", "stream_id"), [(Side.SERVER, 2), (Side.CLIENT, 1)])
def test_peer_opening_a_stream_with_our_parity_is_a_protocol_error(
    side: Side, stream_id: int
) -> None:
    connection = handshaken(side)

    with pytest.raises(MalformedFrameError, match="an id of this side's"):
        feed(connection, OpenFrame(stream_id, "http", {}))

    assert connection.closed


def test_peer_stream_ids_must_increase() -> None:
    server = handshaken()
    feed(server, OpenFrame(5, "http", {}))

    with pytest.raises(MalformedFrameError, match="must increase"):
        feed(server, OpenFrame(3, "http", {}))


def test_half_close_from_the_client_keeps_the_server_direction_open() -> None:
    """exec: stdin reaches EOF, the command's output still flows back."""
    pair = Pair()
    stream_id = pair.client.open_stream("command", {"argv": ["cat"]})
    pair.client.send_data(stream_id, b"input", end_stream=True)

    server_events = pair.send(pair.client)

    assert received(server_events, stream_id) == b"input"
    assert of_type(server_events, StreamEnded) == [StreamEnded(stream_id)]
    assert pair.client.stream_state(stream_id) is StreamState.HALF_CLOSED_LOCAL
    assert pair.server.stream_state(stream_id) is StreamState.HALF_CLOSED_REMOTE
    with pytest.raises(StreamStateError):
        pair.client.send_data(stream_id, b"more")

    pair.server.send_data(stream_id, b"output")
    pair.server.end_stream(stream_id)
    client_events, _ = pair.exchange()

    assert received(client_events, stream_id) == b"output"
    assert of_type(client_events, StreamEnded) == [StreamEnded(stream_id)]
    assert pair.client.stream_state(stream_id) is None
    assert pair.server.stream_state(stream_id) is None
    for connection in (pair.client, pair.server):
        assert connection.stats.streams_closed == 1
        assert connection.open_streams == 0
    assert_accounted(pair.client, pair.server)


def test_half_close_from_the_server_keeps_the_client_direction_open() -> None:
    pair = Pair()
    stream_id = pair.client.open_stream("http")
    pair.exchange()
    pair.server.send_data(stream_id, b"done", end_stream=True)
    client_events, _ = pair.exchange()

    assert of_type(client_events, StreamEnded) == [StreamEnded(stream_id)]
    assert pair.client.stream_state(stream_id) is StreamState.HALF_CLOSED_REMOTE
    with pytest.raises(StreamStateError):
        pair.server.end_stream(stream_id)

    pair.client.send_data(stream_id, b"still talking", end_stream=True)
    _, server_events = pair.exchange()

    assert received(server_events, stream_id) == b"still talking"
    assert pair.client.open_streams == pair.server.open_streams == 0
    assert pair.client.stats.streams_closed == pair.server.stats.streams_closed == 1


def test_open_with_end_stream_sends_no_data_and_expects_an_answer() -> None:
    pair = Pair()
    stream_id = pair.client.open_stream("http", {"method": "GET"}, end_stream=True)

    server_events = pair.send(pair.client)

    assert server_events == [
        StreamOpened(stream_id, "http", {"method": "GET"}, end_stream=True),
        StreamEnded(stream_id),
    ]
    assert pair.client.stream_state(stream_id) is StreamState.HALF_CLOSED_LOCAL
    with pytest.raises(StreamStateError):
        pair.client.send_data(stream_id, b"body")

    pair.server.send_data(stream_id, b"answer", end_stream=True)
    client_events, _ = pair.exchange()
    assert received(client_events, stream_id) == b"answer"
    assert pair.client.open_streams == pair.server.open_streams == 0


def test_end_is_sent_after_the_queued_data() -> None:
    pair = Pair()
    stream_id = pair.client.open_stream("http")
    pair.client.send_data(stream_id, b"a" * 100)
    pair.client.end_stream(stream_id)

    frames = data_frames(sent_frames(pair.client), stream_id)

    assert b"".join(frame.data for frame in frames) == b"a" * 100
    assert [frame.end_stream for frame in frames] == [False] * (len(frames) - 1) + [True]


def test_ending_twice_raises_stream_state_error() -> None:
    pair = Pair()
    stream_id = pair.client.open_stream("http")
    pair.client.end_stream(stream_id)

    with pytest.raises(StreamStateError) as error:
        pair.client.end_stream(stream_id)
    assert error.value.code is ErrorCode.STREAM_CLOSED


def test_reset_reaches_the_peer_with_its_code_and_reason() -> None:
    pair = Pair()
    stream_id = pair.client.open_stream("command")
    pair.exchange()

    pair.client.reset_stream(stream_id, 0x105, "killed by user")
    server_events = pair.send(pair.client)

    assert server_events == [StreamReset(stream_id, 0x105, "killed by user", remote=True)]
    for connection in (pair.client, pair.server):
        assert connection.stream_state(stream_id) is None
        assert connection.stats.streams_reset == 1
    assert_accounted(pair.client, pair.server)


def test_reset_drops_the_data_still_queued() -> None:
    pair = Pair()
    stream_id = pair.client.open_stream("http")
    pair.client.send_data(stream_id, b"never sent")
    pair.client.reset_stream(stream_id)

    frames = sent_frames(pair.client)

    assert data_frames(frames) == []
    assert ResetFrame(stream_id, ErrorCode.CANCEL, "") in frames
    assert pair.client.pending_bytes(stream_id) == 0


def test_reset_of_a_stream_that_already_ended_does_nothing() -> None:
    pair = Pair()
    stream_id = pair.client.open_stream("http")
    pair.client.reset_stream(stream_id)
    pair.exchange()

    pair.client.reset_stream(stream_id)
    pair.server.reset_stream(stream_id)

    assert sent_frames(pair.client) == sent_frames(pair.server) == []


def test_reset_of_a_stream_never_opened_raises_unknown_stream() -> None:
    pair = Pair()
    with pytest.raises(UnknownStreamError):
        pair.client.reset_stream(7)
    with pytest.raises(UnknownStreamError):
        pair.client.send_data(7, b"x")


def test_long_reasons_are_cut_before_they_are_sent() -> None:
    pair = Pair()
    stream_id = pair.client.open_stream("http")

    pair.client.reset_stream(stream_id, ErrorCode.CANCEL, "why " * 1000)

    [reset] = of_type(sent_frames(pair.client), ResetFrame)
    assert len(reset.reason) == MAX_REASON_LENGTH
    assert reset.reason.startswith("why why")


def test_frames_crossing_a_reset_are_dropped() -> None:
    pair = Pair()
    stream_id = pair.client.open_stream("http")
    pair.exchange()
    pair.server.send_data(stream_id, b"in flight", end_stream=True)
    pair.client.reset_stream(stream_id)

    client_events, server_events = pair.exchange()

    assert client_events == []
    assert server_events == [StreamReset(stream_id, ErrorCode.CANCEL, "")]
    assert pair.client.open_streams == pair.server.open_streams == 0
    assert_accounted(pair.client, pair.server)


def test_both_sides_resetting_at_once_is_harmless() -> None:
    pair = Pair()
    stream_id = pair.client.open_stream("http")
    pair.exchange()
    pair.client.reset_stream(stream_id, ErrorCode.CANCEL, "client")
    pair.server.reset_stream(stream_id, ErrorCode.CANCEL, "server")

    client_events, server_events = pair.exchange()

    assert client_events == server_events == []
    assert pair.client.stats.streams_reset == pair.server.stats.streams_reset == 1


def test_every_opened_stream_ends_in_exactly_one_terminal_state() -> None:
    pair = Pair()
    closed = pair.client.open_stream("http", end_stream=True)
    reset_here = pair.client.open_stream("http")
    reset_there = pair.server.open_stream("command")
    left_open = [pair.client.open_stream("http"), pair.server.open_stream("command")]
    pair.exchange()
    pair.server.end_stream(closed)
    pair.client.reset_stream(reset_here)
    pair.client.reset_stream(reset_there)
    pair.exchange()
    assert_accounted(pair.client, pair.server)

    pair.client.close(ErrorCode.INTERNAL_ERROR, "restarting")
    goaway = pair.send(pair.client)

    for connection in (pair.client, pair.server):
        stats = connection.stats
        assert stats.streams_opened == 5
        assert (stats.streams_closed, stats.streams_reset, stats.streams_aborted) == (1, 2, 2)
        assert connection.open_streams == 0
    assert sorted(e.stream_id for e in of_type(goaway, StreamReset)) == sorted(left_open)
    assert_accounted(pair.client, pair.server)


def test_close_leaves_no_stream_behind() -> None:
    pair = Pair()
    stream_ids = [pair.client.open_stream("http") for _ in range(10)]
    pair.client.send_data(stream_ids[0], b"queued")
    pair.exchange()

    pair.client.close(ErrorCode.NO_ERROR, "bye")

    assert pair.client.closed
    assert pair.client.open_streams == 0
    assert pair.client.stream_ids() == []
    assert pair.client.stats.streams_aborted == 10
    assert pair.client.pending_bytes(stream_ids[0]) == 0
    assert [type(f) for f in sent_frames(pair.client)] == [GoAwayFrame]
    assert_accounted(pair.client)


def test_a_closed_connection_refuses_commands_and_input() -> None:
    pair = Pair()
    stream_id = pair.client.open_stream("http")
    pair.client.close()

    with pytest.raises(ConnectionClosedError):
        pair.client.open_stream("http")
    with pytest.raises(ConnectionClosedError):
        pair.client.send_data(stream_id, b"x")
    with pytest.raises(ConnectionClosedError):
        pair.client.send_ping(0.0)
    with pytest.raises(ConnectionClosedError):
        feed(pair.client, DataFrame(2, b"x"))
    pair.client.reset_stream(stream_id)  # the two sides may end together: no error
    pair.client.close()  # closing twice is harmless
    assert pair.client.open_streams == 0
