"""GOAWAY: graceful shutdown, refused streams, and shutdown with an error."""

from __future__ import annotations

import pytest

from protocol import (
    Connection,
    DataReceived,
    ErrorCode,
    GoAwayReceived,
    GoingAwayError,
    Side,
    StreamEnded,
    StreamReset,
    StreamState,
)
from protocol.frames import GoAwayFrame, OpenFrame, ResetFrame

from .pair import Pair, assert_accounted, feed, handshaken, of_type, sent_frames


def handshaken_client_with_streams(count: int) -> Connection:
    """A client with ``count`` streams open (ids 1, 3, 5 ...) and nothing left to send."""
    client = handshaken(Side.CLIENT)
    for _ in range(count):
        client.open_stream("http")
    sent_frames(client)
    return client


def test_goaway_stops_new_streams_on_both_sides() -> None:
    pair = Pair()

    pair.server.goaway(ErrorCode.NO_ERROR, "draining")
    client_events, _ = pair.exchange()

    assert client_events == [GoAwayReceived(0, ErrorCode.NO_ERROR, "draining")]
    assert pair.client.going_away
    assert pair.server.going_away
    for connection in (pair.client, pair.server):
        with pytest.raises(GoingAwayError) as error:
            connection.open_stream("http")
        assert error.value.code is ErrorCode.REFUSED_STREAM
    assert not pair.client.closed
    assert not pair.server.closed


def test_streams_open_before_goaway_finish_normally() -> None:
    pair = Pair()
    stream_id = pair.client.open_stream("http")
    pair.exchange()
    pair.server.goaway()
    pair.exchange()

    pair.client.send_data(stream_id, b"request", end_stream=True)
    pair.server.send_data(stream_id, b"response", end_stream=True)
    client_events, server_events = pair.exchange()

    assert DataReceived(stream_id, b"request") in server_events
    assert DataReceived(stream_id, b"response") in client_events
    assert StreamEnded(stream_id) in client_events
    assert pair.client.open_streams == pair.server.open_streams == 0
    assert pair.client.stats.streams_closed == 1


def test_streams_above_the_last_stream_id_are_refused() -> None:
    pair = Pair()
    seen = pair.client.open_stream("http")
    pair.exchange()
    unseen = pair.client.open_stream("http")  # crosses the GOAWAY on the wire
    pair.server.goaway()

    client_events = pair.send(pair.server)
    server_events = pair.send(pair.client)

    assert client_events[0] == GoAwayReceived(seen, ErrorCode.NO_ERROR, "")
    assert client_events[1:] == [
        StreamReset(unseen, ErrorCode.REFUSED_STREAM, "the peer is going away", remote=True)
    ]
    assert server_events == []  # the server refused the late OPEN without telling its app
    assert [f for f in sent_frames(pair.server) if isinstance(f, ResetFrame)] == [
        ResetFrame(unseen, ErrorCode.REFUSED_STREAM, "this side is going away")
    ]
    assert pair.client.stream_state(seen) is StreamState.OPEN
    assert pair.client.stream_state(unseen) is None
    assert_accounted(pair.client, pair.server)


def test_a_later_goaway_can_only_lower_the_last_stream_id() -> None:
    client = handshaken_client_with_streams(3)

    first = feed(client, GoAwayFrame(3, ErrorCode.NO_ERROR, ""))
    second = feed(client, GoAwayFrame(5, ErrorCode.NO_ERROR, ""))
    third = feed(client, GoAwayFrame(1, ErrorCode.NO_ERROR, ""))

    assert first[0] == GoAwayReceived(3, ErrorCode.NO_ERROR, "")
    assert [e.stream_id for e in of_type(first, StreamReset)] == [5]
    assert second == [GoAwayReceived(3, ErrorCode.NO_ERROR, "")]
    assert [e.stream_id for e in of_type(third, StreamReset)] == [3]
    assert client.stream_ids() == [1]


def test_goaway_with_an_error_resets_every_stream() -> None:
    pair = Pair()
    stream_ids = [pair.client.open_stream("http") for _ in range(3)]
    pair.server.open_stream("command")
    pair.exchange()

    pair.server.close(ErrorCode.INTERNAL_ERROR, "shutting down")
    client_events = pair.send(pair.server)

    assert client_events[0] == GoAwayReceived(5, ErrorCode.INTERNAL_ERROR, "shutting down")
    assert sorted(e.stream_id for e in of_type(client_events, StreamReset)) == sorted(
        [2, *stream_ids]
    )
    assert all(e.code == ErrorCode.INTERNAL_ERROR for e in of_type(client_events, StreamReset))
    assert pair.client.closed
    assert pair.client.close_code == ErrorCode.INTERNAL_ERROR
    assert pair.client.close_reason == "shutting down"
    assert pair.client.open_streams == 0
    assert pair.client.stats.streams_aborted == 4
    assert_accounted(pair.client, pair.server)


def test_goaway_with_an_error_ends_the_message_it_arrives_in() -> None:
    client = handshaken_client_with_streams(1)

    events = feed(
        client,
        GoAwayFrame(0, ErrorCode.PROTOCOL_ERROR, "bad"),
        OpenFrame(2, "command", {}),
    )

    assert [type(e) for e in events] == [GoAwayReceived, StreamReset]
    assert client.closed


def test_goaway_is_sent_once() -> None:
    server = handshaken()
    feed(server, OpenFrame(1, "http", {}))

    server.goaway(ErrorCode.NO_ERROR, "first")
    server.goaway(ErrorCode.NO_ERROR, "second")

    assert sent_frames(server) == [GoAwayFrame(1, ErrorCode.NO_ERROR, "first")]
