"""Malformed input to a connection: a typed protocol error and a GOAWAY, never a crash."""

from __future__ import annotations

import msgpack
import pytest

from protocol import (
    ConnectionClosedError,
    ErrorCode,
    MalformedFrameError,
    RemoteProtocolError,
    StreamReset,
)
from protocol.frames import (
    DataFrame,
    Frame,
    GoAwayFrame,
    OpenFrame,
    ResetFrame,
    WindowFrame,
    encode_message,
)

from .pair import Pair, feed, handshaken, of_type, sent_frames


def assert_failed_with_goaway(connection_frames: list[Frame], code: ErrorCode) -> None:
    [goaway] = connection_frames
    assert isinstance(goaway, GoAwayFrame)
    assert goaway.code == code


@pytest.mark.parametrize(
    "message",
    [
        encode_message([DataFrame(1, b"x" * 100)])[:-10],
        b"\xdd\xff\xff\xff\xff",
        msgpack.packb([[3, 1, "not bytes", 0]]),
        msgpack.packb([[3, 1, b"x", "0"]]),
        msgpack.packb([[5, 1]]),
        msgpack.packb([[42]]),
        msgpack.packb({"frames": []}),
        msgpack.packb([[2, 1, "http", {1: 1}, 0]]),
    ],
    ids=[
        "truncated",
        "array claiming more than it holds",
        "text payload",
        "text flags",
        "short WINDOW",
        "unknown frame type",
        "not an array",
        "integer header key",
    ],
)
def test_malformed_messages_fail_the_connection_with_protocol_error(message: bytes) -> None:
    server = handshaken()
    feed(server, OpenFrame(1, "http", {}))

    with pytest.raises(MalformedFrameError) as error:
        server.receive_data(message, 0.0)

    assert error.value.code is ErrorCode.PROTOCOL_ERROR
    assert server.closed
    assert server.stats.streams_aborted == 1
    assert_failed_with_goaway(sent_frames(server), ErrorCode.PROTOCOL_ERROR)


@pytest.mark.parametrize(
    "frame",
    [DataFrame(9, b"x"), ResetFrame(9, 0), WindowFrame(9, 1), DataFrame(8, b"x")],
    ids=["DATA", "RESET", "WINDOW", "DATA on our own id"],
)
def test_frames_for_streams_never_opened_are_a_protocol_error(frame: Frame) -> None:
    server = handshaken()
    feed(server, OpenFrame(1, "http", {}))

    with pytest.raises(MalformedFrameError, match="never opened"):
        feed(server, frame)

    assert_failed_with_goaway(sent_frames(server), ErrorCode.PROTOCOL_ERROR)


def test_data_after_the_peer_ended_its_side_resets_the_stream() -> None:
    server = handshaken()
    feed(server, OpenFrame(1, "http", {}, end_stream=True))

    events = feed(server, DataFrame(1, b"late"))

    [reset] = of_type(events, StreamReset)
    assert (reset.stream_id, reset.code, reset.remote) == (1, ErrorCode.STREAM_CLOSED, False)
    assert ResetFrame(1, ErrorCode.STREAM_CLOSED, reset.reason) in sent_frames(server)
    assert not server.closed


def test_data_after_a_clean_close_is_dropped() -> None:
    pair = Pair()
    stream_id = pair.client.open_stream("http", end_stream=True)
    pair.exchange()
    pair.server.end_stream(stream_id)
    pair.exchange()
    assert pair.server.stream_state(stream_id) is None

    assert feed(pair.server, DataFrame(stream_id, b"late")) == []
    assert not pair.server.closed


def test_input_after_the_connection_ended_raises_connection_closed() -> None:
    server = handshaken()
    server.close()

    with pytest.raises(ConnectionClosedError):
        feed(server, DataFrame(1, b"x"))


def test_only_protocol_errors_escape_for_a_failed_connection() -> None:
    server = handshaken()
    with pytest.raises(RemoteProtocolError):
        server.receive_data(b"\xc1", 0.0)

    # The I/O layer may still hand over what was in flight: a typed error again.
    with pytest.raises(ConnectionClosedError):
        server.receive_data(b"\xc1", 0.0)
