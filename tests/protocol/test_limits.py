"""Limits: frame size, header size, stream count; each breach a typed error with its code."""

from __future__ import annotations

import struct

import msgpack
import pytest

from protocol import (
    Connection,
    ErrorCode,
    FrameSizeError,
    HeaderTooLargeError,
    Limits,
    MalformedFrameError,
    MessageReceived,
    ProtocolError,
    Side,
    StreamIdsExhaustedError,
    StreamLimitError,
    StreamOpened,
    StreamReset,
)
from protocol import errors as protocol_errors
from protocol.checks import MAX_GROWTH, packed_size
from protocol.frames import (
    MAX_KIND_LENGTH,
    DataFrame,
    GoAwayFrame,
    MessageFrame,
    OpenFrame,
    ResetFrame,
    decode_message,
    encode_message,
)
from protocol.limits import MAX_STREAM_ID, MESSAGE_OVERHEAD, MIN_FRAME_SIZE

from .pair import Pair, assert_accounted, feed, handshaken, hello, of_type, sent_frames

SMALL = Limits(max_frame_size=MIN_FRAME_SIZE, max_header_size=1024, max_streams=2)


def goaway_code(connection: Connection) -> int:
    [goaway] = [f for f in sent_frames(connection) if isinstance(f, GoAwayFrame)]
    return goaway.code


def test_data_over_our_max_frame_size_is_a_frame_size_error() -> None:
    server = handshaken(limits=SMALL)
    feed(server, OpenFrame(1, "http", {}))

    with pytest.raises(FrameSizeError) as error:
        feed(server, DataFrame(1, b"x" * (MIN_FRAME_SIZE + 1)))

    assert error.value.code is ErrorCode.FRAME_SIZE_ERROR
    assert goaway_code(server) == ErrorCode.FRAME_SIZE_ERROR


def test_a_message_over_the_message_limit_is_a_frame_size_error() -> None:
    server = handshaken(limits=SMALL)
    frames = [DataFrame(1, b"x" * 1000)] * (SMALL.message_limit // 1000 + 1)
    message = encode_message(frames)
    assert len(message) > MIN_FRAME_SIZE + MESSAGE_OVERHEAD

    with pytest.raises(FrameSizeError, match="exceeds the limit"):
        server.receive_data(message, 0.0)

    assert goaway_code(server) == ErrorCode.FRAME_SIZE_ERROR


def test_open_with_headers_over_the_limit_is_reset_with_header_too_large() -> None:
    server = handshaken(limits=SMALL)

    events = feed(server, OpenFrame(1, "http", {"big": "x" * 2000}), DataFrame(1, b"body"))

    assert events == []
    assert server.open_streams == 0
    [reset] = of_type(sent_frames(server), ResetFrame)
    assert (reset.stream_id, reset.code) == (1, ErrorCode.HEADER_TOO_LARGE)
    assert not server.closed
    assert of_type(feed(server, OpenFrame(3, "http", {"small": "x"})), StreamOpened)


def open_with_float32s(count: int) -> bytes:
    """A message of one OPEN (stream 1) whose headers are {"f": [0.5] * count} as float32s.

    msgpack encodes a float32 in 5 bytes and, decoded, again as a float64 in
    9: the map that grows most when it is measured by encoding it again.
    """
    floats = b"".join(struct.pack(">Bf", 0xCA, 0.5) for _ in range(count))
    headers = b"\x81\xa1f" + struct.pack(">BH", 0xDC, count) + floats
    return b"\x91\x95\x02\x01\xa4http" + headers + b"\x00"


def test_received_headers_are_measured_as_they_encode_again() -> None:
    server = handshaken(limits=SMALL)
    message = open_with_float32s(150)
    decoded = msgpack.unpackb(message)[0][3]
    assert len(message) < SMALL.max_header_size < packed_size(decoded)

    assert server.receive_data(message, 0.0) == []

    [reset] = of_type(sent_frames(server), ResetFrame)
    assert (reset.stream_id, reset.code) == (1, ErrorCode.HEADER_TOO_LARGE)


def test_a_message_too_short_for_oversized_headers_cannot_hold_them() -> None:
    # Such a message is not measured again (the work per request), which is
    # sound only if even the fastest-growing map in it stays within the limit.
    server = handshaken(limits=SMALL)
    count = 1
    while len(open_with_float32s(count + 1)) * MAX_GROWTH <= SMALL.max_header_size:
        count += 1
    message = open_with_float32s(count)
    decoded = msgpack.unpackb(message)[0][3]

    assert packed_size(decoded) <= SMALL.max_header_size
    assert of_type(server.receive_data(message, 0.0), StreamOpened)


def test_local_headers_over_the_peer_limit_raise_header_too_large() -> None:
    client = handshaken(Side.CLIENT, peer_limits=SMALL)

    with pytest.raises(HeaderTooLargeError) as error:
        client.open_stream("http", {"big": "x" * 2000})

    assert error.value.code is ErrorCode.HEADER_TOO_LARGE
    assert sent_frames(client) == []
    assert client.open_streams == 0
    assert client.open_stream("http") == 1  # the refused open used no stream id


def test_local_message_over_the_peer_limit_raises_header_too_large() -> None:
    client = handshaken(Side.CLIENT, peer_limits=SMALL)

    with pytest.raises(HeaderTooLargeError, match="send it on a stream"):
        client.send_message("cert.renew", {"csr": "x" * 2000})

    assert sent_frames(client) == []


def test_a_message_within_the_limit_is_delivered() -> None:
    pair = Pair()
    pair.client.send_message("cert.renew", {"csr": "PEM"})

    assert pair.send(pair.client) == [MessageReceived("cert.renew", {"csr": "PEM"})]


def test_a_received_message_over_the_header_limit_is_refused() -> None:
    server = handshaken(limits=SMALL)

    with pytest.raises(FrameSizeError) as error:
        feed(server, MessageFrame("cert.renew", {"csr": "x" * 2000}))

    assert error.value.code is ErrorCode.HEADER_TOO_LARGE
    assert goaway_code(server) == ErrorCode.HEADER_TOO_LARGE


def test_a_peer_opening_more_streams_than_allowed_is_refused() -> None:
    server = handshaken(limits=SMALL)

    events = feed(server, *(OpenFrame(i, "http", {}) for i in (1, 3, 5)))

    assert [e.stream_id for e in of_type(events, StreamOpened)] == [1, 3]
    [reset] = of_type(sent_frames(server), ResetFrame)
    assert (reset.stream_id, reset.code) == (5, ErrorCode.REFUSED_STREAM)
    assert not server.closed
    assert_accounted(server)


def test_a_stream_of_a_kind_this_side_does_not_take_is_refused_without_an_event() -> None:
    server = Connection(Side.SERVER, stream_kinds={"command.report"})
    sent_frames(server)
    feed(server, hello())

    events = feed(server, OpenFrame(1, "http", {}), OpenFrame(3, "command.report", {}))

    assert [(e.stream_id, e.kind) for e in of_type(events, StreamOpened)] == [(3, "command.report")]
    [reset] = of_type(sent_frames(server), ResetFrame)
    assert (reset.stream_id, reset.code) == (1, ErrorCode.REFUSED_STREAM)
    assert reset.reason == "this side takes no http streams"
    assert not server.closed
    assert_accounted(server)


def test_opening_more_streams_than_the_peer_allows_raises_stream_limit() -> None:
    pair = Pair(server=Connection(Side.SERVER, SMALL))
    first = pair.client.open_stream("http")
    pair.client.open_stream("http")

    with pytest.raises(StreamLimitError) as error:
        pair.client.open_stream("http")

    assert error.value.code is ErrorCode.REFUSED_STREAM
    pair.client.reset_stream(first)
    pair.client.open_stream("http")  # an ended stream frees its place
    _, server_events = pair.exchange()
    assert of_type(server_events, StreamReset) == [StreamReset(first, ErrorCode.CANCEL)]
    assert pair.server.open_streams == 2


def test_stream_ids_run_out_before_they_pass_the_maximum() -> None:
    client = handshaken(Side.CLIENT)
    # Reaching the end honestly takes 2**30 streams; jump there instead.
    client._next_stream_id = MAX_STREAM_ID

    assert client.open_stream("http") == MAX_STREAM_ID
    client.reset_stream(MAX_STREAM_ID)
    with pytest.raises(StreamIdsExhaustedError) as error:
        client.open_stream("http")
    assert error.value.code is ErrorCode.REFUSED_STREAM


@pytest.mark.parametrize("kind", ["", "k" * (MAX_KIND_LENGTH + 1)])
def test_stream_and_message_kinds_are_short_names(kind: str) -> None:
    client = handshaken(Side.CLIENT)

    with pytest.raises(ValueError, match="kind"):
        client.open_stream(kind)
    with pytest.raises(ValueError, match="kind"):
        client.send_message(kind, {})


def test_headers_the_peer_could_not_decode_are_refused_locally() -> None:
    client = handshaken(Side.CLIENT)

    with pytest.raises(ValueError, match="msgpack"):
        client.open_stream("http", {"nested": {1: "integer keys are not allowed"}})
    with pytest.raises(ValueError, match="msgpack"):
        client.send_message("x", {"value": object()})

    assert sent_frames(client) == []
    assert client.open_streams == 0


@pytest.mark.parametrize("code", [-1, 2**32])
def test_codes_outside_32_bits_are_refused_locally(code: int) -> None:
    client = handshaken(Side.CLIENT)
    stream_id = client.open_stream("http")

    with pytest.raises(ValueError, match="code"):
        client.reset_stream(stream_id, code)
    with pytest.raises(ValueError, match="code"):
        client.goaway(code)
    with pytest.raises(ValueError, match="code"):
        client.close(code)
    assert not client.closed


def test_messages_stay_within_the_peer_limit_whatever_the_kinds() -> None:
    # Kinds are counted in characters but sent as UTF-8: four bytes apiece here.
    pair = Pair()
    kind = "\N{GRINNING FACE}" * MAX_KIND_LENGTH
    for _ in range(1000):
        pair.client.open_stream(kind, {"n": 1})
        pair.client.send_message(kind, {"n": 2})

    messages = pair.client.data_to_send()

    assert all(len(m) <= pair.server.limits.message_limit for m in messages)
    frames = [f for m in messages for f in decode_message(m, pair.server.limits)]
    assert len(of_type(frames, OpenFrame)) == len(of_type(frames, MessageFrame)) == 1000


@pytest.mark.parametrize(
    "changes",
    [
        {"max_frame_size": MIN_FRAME_SIZE - 1},
        {"max_frame_size": 16 * 1024 * 1024 + 1},
        {"max_header_size": 1023},
        {"max_header_size": 64 * 1024 + 1},
        {"max_streams": 0},
        {"initial_window": 0},
        {"connection_window": 2**31},
        {"max_send_buffer": 0},
    ],
    ids=lambda changes: next(iter(changes)),
)
def test_limits_out_of_range_are_refused(changes: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="invalid limits"):
        Limits().replace(**changes)


def test_a_peer_announcing_invalid_limits_is_refused() -> None:
    wire = Limits().to_wire()
    wire["max_frame_size"] = 100

    with pytest.raises(MalformedFrameError, match="max_frame_size"):
        Limits.from_wire(wire)
    with pytest.raises(MalformedFrameError, match="integer"):
        Limits.from_wire({**Limits().to_wire(), "max_streams": "many"})
    assert Limits.from_wire({**Limits().to_wire(), "future": 1}) == Limits()


@pytest.mark.parametrize(
    ("error", "code"),
    [
        ("FrameSizeError", ErrorCode.FRAME_SIZE_ERROR),
        ("FlowControlError", ErrorCode.FLOW_CONTROL_ERROR),
        ("UnsupportedVersionError", ErrorCode.UNSUPPORTED_VERSION),
        ("ExcessiveLoadError", ErrorCode.EXCESSIVE_LOAD),
        ("KeepaliveTimeoutError", ErrorCode.TIMEOUT),
        ("MalformedFrameError", ErrorCode.PROTOCOL_ERROR),
        ("HeaderTooLargeError", ErrorCode.HEADER_TOO_LARGE),
        ("StreamLimitError", ErrorCode.REFUSED_STREAM),
        ("GoingAwayError", ErrorCode.REFUSED_STREAM),
        ("StreamStateError", ErrorCode.STREAM_CLOSED),
        ("SendBufferFullError", ErrorCode.FLOW_CONTROL_ERROR),
        ("AcknowledgeError", ErrorCode.FLOW_CONTROL_ERROR),
    ],
)
def test_each_error_carries_its_wire_code(error: str, code: ErrorCode) -> None:
    cls = getattr(protocol_errors, error)
    assert issubclass(cls, ProtocolError)
    assert cls("message").code is code
    assert cls("message", code=ErrorCode.CANCEL).code is ErrorCode.CANCEL


def test_the_connection_wide_send_buffer_caps_what_many_streams_queue() -> None:
    """Per-stream room is not enough with many streams: the total is bounded too."""
    limits = Limits(max_send_buffer=64 * 1024, max_send_buffer_total=128 * 1024)
    connection = handshaken(Side.SERVER, limits)
    first, second, third = (connection.open_stream("http") for _ in range(3))
    connection.send_data(first, b"a" * 64 * 1024)
    connection.send_data(second, b"b" * 64 * 1024)
    assert connection.queued_bytes == 128 * 1024
    assert connection.send_capacity(third) == 0  # its own buffer is empty, the total is not
    with pytest.raises(protocol_errors.SendBufferFullError, match="on the connection"):
        connection.send_data(third, b"c")
    sent_frames(connection)  # the peer's credit lets the queued bytes be framed
    assert connection.queued_bytes == 0
    assert connection.send_capacity(third) == 64 * 1024
    connection.reset_stream(first)
    assert connection.queued_bytes == 0


def test_bytes_dropped_by_a_reset_free_the_connection_wide_buffer() -> None:
    limits = Limits(max_send_buffer=64 * 1024, max_send_buffer_total=64 * 1024)
    connection = handshaken(Side.SERVER, limits, peer_limits=Limits(initial_window=1))
    stalled = connection.open_stream("http")
    waiting = connection.open_stream("http")
    connection.send_data(stalled, b"x" * 64 * 1024)
    sent_frames(connection)  # one byte of credit: nearly everything stays queued
    assert connection.send_capacity(waiting) < 16
    connection.reset_stream(stalled)
    assert connection.send_capacity(waiting) == 64 * 1024
