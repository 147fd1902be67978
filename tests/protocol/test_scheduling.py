"""Scheduling: frame sizes, round-robin between streams, control frames first, fairness."""

from __future__ import annotations

from protocol import Connection, DataReceived, ErrorCode, Limits, PongReceived, Side
from protocol.events import Event
from protocol.frames import (
    DataFrame,
    Frame,
    MessageFrame,
    OpenFrame,
    PingFrame,
    PongFrame,
    ResetFrame,
    WindowFrame,
    decode_message,
)

from .pair import READ_ALL, Pair, data_frames, feed, handshaken, of_type, sent_frames

_CONTROL = (WindowFrame, PingFrame, PongFrame, ResetFrame, MessageFrame, OpenFrame)


def test_data_is_cut_into_frames_no_larger_than_the_peer_accepts() -> None:
    server = Connection(Side.SERVER, Limits(max_frame_size=16 * 1024, max_header_size=1024))
    client = Connection(Side.CLIENT, Limits(max_frame_size=1024 * 1024))
    pair = Pair(client, server)
    stream_id = pair.client.open_stream("http")
    payload = bytes(range(256)) * 400  # 100 KiB

    pair.client.send_data(stream_id, payload)
    messages = pair.client.data_to_send()

    frames = [f for m in messages for f in decode_message(m, READ_ALL)]
    sizes = [len(f.data) for f in data_frames(frames)]
    assert max(sizes) == 16 * 1024
    assert b"".join(f.data for f in data_frames(frames)) == payload
    assert all(len(message) <= server.limits.message_limit for message in messages)


def test_small_writes_on_one_stream_coalesce_into_one_frame() -> None:
    client = handshaken(Side.CLIENT)
    stream_id = client.open_stream("http")
    sent_frames(client)
    for _ in range(10):
        client.send_data(stream_id, b"x" * 100)

    [frame] = data_frames(sent_frames(client))

    assert frame == DataFrame(stream_id, b"x" * 1000)


def test_streams_take_turns_one_frame_each() -> None:
    peer_limits = Limits(max_frame_size=16 * 1024, max_header_size=1024)
    client = handshaken(Side.CLIENT, peer_limits=peer_limits)
    stream_ids = [client.open_stream("http") for _ in range(3)]
    sent_frames(client)
    for stream_id in stream_ids:
        client.send_data(stream_id, b"x" * 3 * 16 * 1024)

    order = [frame.stream_id for frame in data_frames(sent_frames(client))]

    assert order == stream_ids * 3


def test_small_frames_of_many_streams_share_a_message_in_turn() -> None:
    client = handshaken(Side.CLIENT)
    stream_ids = [client.open_stream("http") for _ in range(50)]
    sent_frames(client)
    for stream_id in stream_ids:
        client.send_data(stream_id, b"x" * 100)

    [message] = client.data_to_send()

    frames = decode_message(message, READ_ALL)
    assert frames == [DataFrame(stream_id, b"x" * 100) for stream_id in stream_ids]


def test_control_frames_jump_the_queued_data() -> None:
    # A client that never shares, so that acknowledging returns a stream WINDOW.
    pair = Pair(client=Connection(Side.CLIENT, Limits(shared_span=0)))
    bulk = pair.client.open_stream("http")
    doomed = pair.client.open_stream("http")
    incoming = pair.server.open_stream("command")
    pair.exchange()
    pair.server.send_data(incoming, b"x" * 300_000)
    received = pair.send(pair.server)
    pair.client.send_data(bulk, b"y" * 1_000_000)
    first = sent_frames(pair.client, max_messages=1)  # the socket took one message
    assert of_type(first, DataFrame)

    # Now every kind of control frame is queued behind the bulk data.
    for event in of_type(received, DataReceived):
        pair.client.acknowledge_data(event.stream_id, len(event.data))
    pair.client.send_ping(0.0)
    pair.client.send_message("cert.renew", {"csr": "..."})
    pair.client.reset_stream(doomed, ErrorCode.CANCEL)
    opened = pair.client.open_stream("http")
    feed(pair.client, PingFrame(99))
    pair.client.goaway()

    frames = sent_frames(pair.client, max_messages=1)

    kinds = [type(frame).__name__ for frame in frames]
    control = kinds[: kinds.index("DataFrame")]
    assert set(control) == {
        "WindowFrame",
        "PingFrame",
        "MessageFrame",
        "ResetFrame",
        "OpenFrame",
        "PongFrame",
        "GoAwayFrame",
    }
    assert set(kinds[len(control) :]) == {"DataFrame"}
    assert OpenFrame(opened, "http", {}) in frames


def test_max_messages_pulls_one_message_at_a_time() -> None:
    client = handshaken(Side.CLIENT)
    stream_id = client.open_stream("http")
    client.send_data(stream_id, b"z" * 200_000)
    sent_before = client.stats.messages_sent

    messages = []
    while batch := client.data_to_send(max_messages=1):
        assert len(batch) == 1
        messages.extend(batch)

    frames = [f for m in messages for f in decode_message(m, READ_ALL)]
    assert b"".join(f.data for f in data_frames(frames)) == b"z" * 200_000
    assert len(messages) >= 200_000 // Limits().max_frame_size
    assert client.stats.messages_sent - sent_before == len(messages)


def test_a_stalled_stream_does_not_hold_up_others_or_pings() -> None:
    """Fairness: one consumer stops reading; its window fills; everything else flows."""
    server = Connection(Side.SERVER, Limits(initial_window=64 * 1024))
    pair = Pair(server=server)
    stalled = pair.client.open_stream("http")
    lively = pair.client.open_stream("http")
    pair.exchange()

    stalled_bytes = 0
    lively_bytes = 0
    pongs: list[PongReceived] = []
    for round_number in range(50):
        pair.now = float(round_number)
        if pair.client.send_capacity(stalled):
            pair.client.send_data(stalled, b"s" * pair.client.send_capacity(stalled))
        pair.client.send_data(lively, b"l" * 20_000)
        pair.client.send_ping(pair.now)
        client_events, server_events = pair.exchange()
        pongs.extend(of_type(client_events, PongReceived))
        for event in of_type(server_events, DataReceived):
            if event.stream_id == stalled:
                stalled_bytes += len(event.data)
            else:
                lively_bytes += len(event.data)
                pair.server.acknowledge_data(lively, len(event.data))  # stalled: never

    assert stalled_bytes == 64 * 1024
    assert pair.client.send_window(stalled) == 0
    assert pair.client.pending_bytes(stalled) > 0
    assert lively_bytes == 50 * 20_000
    assert len(pongs) == 50


def test_a_stream_without_credit_lets_its_neighbours_use_the_message() -> None:
    client = handshaken(Side.CLIENT, peer_limits=Limits(initial_window=100))
    blocked = client.open_stream("http")
    client.send_data(blocked, b"b" * 100)
    sent_frames(client)  # the window is spent
    client.send_data(blocked, b"b" * 100)
    other = client.open_stream("http")
    client.send_data(other, b"o" * 50)

    frames: list[Frame] = sent_frames(client)

    assert data_frames(frames) == [DataFrame(other, b"o" * 50)]
    events: list[Event] = feed(client, WindowFrame(blocked, 100))
    assert events == []
    assert data_frames(sent_frames(client)) == [DataFrame(blocked, b"b" * 100)]


def test_end_without_data_needs_no_credit() -> None:
    client = handshaken(Side.CLIENT, peer_limits=Limits(initial_window=100))
    stream_id = client.open_stream("http")
    client.send_data(stream_id, b"x" * 100)
    sent_frames(client)
    assert client.send_window(stream_id) == 0

    client.end_stream(stream_id)

    assert data_frames(sent_frames(client)) == [DataFrame(stream_id, b"", end_stream=True)]


def test_a_frame_spends_exactly_its_credit_across_queued_writes() -> None:
    # Two writes that together exceed the window: the frame must still fill it,
    # splitting the second write, or credit would be charged and not used.
    client = handshaken(Side.CLIENT, peer_limits=Limits(initial_window=3000))
    stream_id = client.open_stream("http")
    client.send_data(stream_id, b"a" * 153)
    client.send_data(stream_id, b"b" * 2848)

    [frame] = data_frames(sent_frames(client))

    assert frame == DataFrame(stream_id, b"a" * 153 + b"b" * 2847)
    assert client.send_window(stream_id) == 0
    assert client.pending_bytes(stream_id) == 1
    feed(client, WindowFrame(stream_id, 10))
    assert data_frames(sent_frames(client)) == [DataFrame(stream_id, b"b")]


def test_a_stream_data_never_overtakes_its_open() -> None:
    # Three OPENs with big headers do not fit one message; the third stream's
    # data must wait for the message that carries its OPEN.
    pair = Pair()
    headers = {"blob": "h" * 30_000}
    stream_ids = [pair.client.open_stream("http", headers) for _ in range(3)]
    for stream_id in stream_ids:
        pair.client.send_data(stream_id, b"body", end_stream=True)

    messages = pair.client.data_to_send()

    assert len(messages) >= 2
    seen: set[int] = set()
    for frame in (f for m in messages for f in decode_message(m, READ_ALL)):
        if isinstance(frame, OpenFrame):
            seen.add(frame.stream_id)
        elif isinstance(frame, DataFrame):
            assert frame.stream_id in seen
    events = [e for m in messages for e in pair.server.receive_data(m, 0.0)]
    assert [e.data for e in of_type(events, DataReceived)] == [b"body"] * 3


def test_queued_frames_counts_control_frames_and_streams_with_something_to_send() -> None:
    client = handshaken(Side.CLIENT)
    assert client.queued_frames == 0

    first, second = client.open_stream("http"), client.open_stream("http")
    assert client.queued_frames == 2  # two OPENs
    sent_frames(client)
    assert client.queued_frames == 0

    client.send_data(first, b"x")
    client.send_data(second, b"y")
    client.send_data(first, b"z")
    assert client.queued_frames == 2  # two streams, however many writes
    sent_frames(client)
    assert client.queued_frames == 0
