"""Sharing the connection: a stream's credit while other streams are active.

The receiver tops each stream's credit up to the whole window while the stream
has the connection to itself, and only to the shared target while another
stream was active within the last ``shared_span`` bytes received
(docs/protocol.md, "Sharing the connection").
"""

from __future__ import annotations

import pytest

from protocol import DataReceived, Limits, Side
from protocol.connection import Connection
from protocol.events import Event
from protocol.frames import PingFrame, PongFrame, WindowFrame
from protocol.sharing import NEVER, RecentStreams

from .pair import Pair, feed, of_type, sent_frames

KIB = 1024
MIB = 1024 * KIB
WINDOW = 1 * MIB
SHARED = 64 * KIB
SPAN = 2 * MIB


def receiver(**limits: int) -> Connection:
    return Connection(Side.CLIENT, Limits(**limits))


def acknowledge_all(connection: Connection, events: list[Event]) -> None:
    for event in of_type(events, DataReceived):
        connection.acknowledge_data(event.stream_id, len(event.data))


def credit(pair: Pair, stream_id: int) -> int:
    """The credit the sender holds on a stream once the receiver's WINDOWs arrive."""
    pair.send(pair.client)
    return pair.server.send_window(stream_id)


def fill(pair: Pair, stream_id: int, size: int) -> list[Event]:
    """The server sends ``size`` bytes on a stream; the client's events."""
    pair.server.send_data(stream_id, b"x" * size)
    return pair.send(pair.server)


def shared(pair: Pair) -> tuple[int, int]:
    """Open a bulk and a small stream; the small one's answer makes the connection shared."""
    bulk = pair.server.open_stream("http")
    small = pair.server.open_stream("http")
    fill(pair, small, 100)
    return bulk, small


def bulk_then_small(pair: Pair, size: int) -> int:
    """``size`` bytes arrive on a bulk stream, then a small answer; all are acknowledged."""
    bulk = pair.server.open_stream("http")
    small = pair.server.open_stream("http")
    events = fill(pair, bulk, size)
    events += fill(pair, small, 100)
    acknowledge_all(pair.client, events)
    return bulk


def test_a_stream_alone_gets_the_whole_window_back() -> None:
    pair = Pair(client=receiver())
    bulk = pair.server.open_stream("http")
    events = fill(pair, bulk, WINDOW)

    acknowledge_all(pair.client, events)

    assert credit(pair, bulk) == WINDOW


def test_while_another_stream_is_active_credit_is_topped_up_to_the_shared_window() -> None:
    pair = Pair(client=receiver())
    bulk = bulk_then_small(pair, WINDOW)

    # The bulk stream may have 64 KiB on its way, not a megabyte, so the small
    # stream's next bytes wait behind at most that much.
    assert credit(pair, bulk) == SHARED


def test_credit_the_peer_still_holds_is_spent_before_any_more_is_given() -> None:
    pair = Pair(client=receiver())
    bulk, _ = shared(pair)
    events = fill(pair, bulk, WINDOW // 2)  # the peer still holds half a window

    acknowledge_all(pair.client, events)

    assert of_type(sent_frames(pair.client), WindowFrame) == []


def test_the_whole_window_comes_back_after_the_span_without_other_activity() -> None:
    pair = Pair(client=receiver())
    bulk, _ = shared(pair)
    received = 0
    credits = []
    while received <= SPAN + WINDOW:
        events = fill(pair, bulk, pair.server.send_window(bulk))
        received += sum(len(event.data) for event in of_type(events, DataReceived))
        acknowledge_all(pair.client, events)
        credits.append(credit(pair, bulk))

    assert credits[0] == SHARED
    assert credits[-1] == WINDOW
    assert credits.count(SHARED) > 1  # shared until the span had passed
    assert all(SHARED <= each <= WINDOW for each in credits)


def test_a_stream_opened_by_either_side_counts_as_activity() -> None:
    pair = Pair(client=receiver())
    bulk = pair.server.open_stream("http")
    events = fill(pair, bulk, WINDOW)
    pair.client.open_stream("command")  # this side opens one: the connection is shared

    acknowledge_all(pair.client, events)

    assert credit(pair, bulk) == SHARED


def test_a_long_round_trip_keeps_the_whole_window_while_sharing() -> None:
    # 64 MiB/s over 50 ms is more than the window: holding bytes back would
    # only slow the transfer, since they are on the wire rather than queued.
    client = receiver()
    pair = Pair(client=client)
    opaque = client.send_ping(0.0)
    pair.send(pair.client)
    feed(client, PongFrame(opaque), now=0.050)
    bulk, _ = shared(pair)
    events = fill(pair, bulk, WINDOW)

    acknowledge_all(client, events)

    assert client.min_rtt == pytest.approx(0.050)
    assert credit(pair, bulk) == WINDOW


def test_the_shared_target_follows_the_smallest_round_trip() -> None:
    client = receiver()
    pair = Pair(client=client)
    for sent, answered in ((0.0, 0.002), (1.0, 1.010)):  # 2 ms, then a slower 10 ms
        opaque = client.send_ping(sent)
        pair.send(pair.client)
        feed(client, PongFrame(opaque), now=answered)
    bulk, _ = shared(pair)
    events = fill(pair, bulk, WINDOW)

    acknowledge_all(client, events)

    assert client.min_rtt == pytest.approx(0.002)
    target = int(64 * MIB * 0.002)  # 134 KB in flight keeps 64 MiB/s
    assert target - target // 4 < credit(pair, bulk) <= target


def test_a_shared_span_of_zero_never_shares() -> None:
    pair = Pair(client=receiver(shared_span=0))
    bulk = bulk_then_small(pair, WINDOW)

    assert credit(pair, bulk) == WINDOW


def test_the_shared_window_is_never_above_the_window() -> None:
    pair = Pair(client=receiver(initial_window=32 * KIB))
    bulk = bulk_then_small(pair, 32 * KIB)

    assert credit(pair, bulk) == 32 * KIB


def test_the_peers_pings_do_not_measure_this_sides_round_trip() -> None:
    client = receiver()
    Pair(client=client)

    feed(client, PingFrame(7))  # answered with a PONG, but timed by the peer

    assert client.min_rtt is None


def alone_for_a_while(pair: Pair, bulk: int) -> None:
    """Run ``bulk`` past the span with nothing else active: its credit is the window again."""
    received = 0
    while received <= SPAN + WINDOW:
        events = fill(pair, bulk, pair.server.send_window(bulk))
        received += sum(len(event.data) for event in of_type(events, DataReceived))
        acknowledge_all(pair.client, events)
        pair.send(pair.client)
    assert pair.server.send_window(bulk) == WINDOW


def test_data_arriving_on_another_stream_shares_the_connection_again() -> None:
    pair = Pair(client=receiver())
    bulk = pair.server.open_stream("http")
    small = pair.server.open_stream("http")
    alone_for_a_while(pair, bulk)

    events = fill(pair, small, 100)  # a small answer arrives
    events += fill(pair, bulk, WINDOW)
    acknowledge_all(pair.client, events)

    assert credit(pair, bulk) == SHARED


def test_a_stream_the_peer_opens_shares_the_connection_again() -> None:
    pair = Pair(client=receiver())
    bulk = pair.server.open_stream("http")
    alone_for_a_while(pair, bulk)

    pair.server.open_stream("http")  # no data on it: being opened is activity
    events = fill(pair, bulk, WINDOW)
    acknowledge_all(pair.client, events)

    assert credit(pair, bulk) == SHARED


def test_a_consumer_that_reads_whole_messages_is_not_stalled_while_sharing() -> None:
    # Sharing bounds the credit the peer holds (what queues in front of other
    # streams), not the bytes delivered and not yet taken: credit goes back on
    # delivery, so a consumer that acknowledges only whole 200 KiB messages
    # still gets every byte.
    pair = Pair(client=receiver())
    bulk, small = shared(pair)
    total, message = 3 * WINDOW, 200 * KIB
    pair.server.send_data(bulk, b"y" * WINDOW)
    queued, delivered, unread = WINDOW, 0, 0
    held: list[int] = []
    for _ in range(1000):
        if queued < total and pair.server.send_capacity(bulk) >= message:
            pair.server.send_data(bulk, b"y" * message)
            queued += message
        pair.server.send_data(small, b"z")  # the small stream stays active
        events = pair.send(pair.server)
        received = sum(
            len(event.data) for event in of_type(events, DataReceived) if event.stream_id == bulk
        )
        delivered, unread = delivered + received, unread + received
        while unread >= message or (delivered == total and unread):
            taken = min(unread, message)
            pair.client.acknowledge_data(bulk, taken)
            unread -= taken
        pair.send(pair.client)
        if delivered == total:
            break
        held.append(pair.server.send_window(bulk))

    assert delivered == total
    assert max(held[3:]) <= SHARED  # once the initial window is spent


def test_recent_streams_answer_for_every_stream_but_the_one_asked_about() -> None:
    recent = RecentStreams()
    assert recent.others_since(1) == NEVER

    recent.touch(1, 10)
    recent.touch(1, 20)
    assert recent.others_since(1) == NEVER
    assert recent.others_since(3) == 20

    recent.touch(3, 30)
    recent.touch(1, 40)
    assert recent.others_since(1) == 30
    assert recent.others_since(3) == 40
    assert recent.others_since(5) == 40


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("shared_window", 0, "shared_window must be positive"),
        ("shared_span", -1, "shared_span must not be negative"),
        ("shared_rate", 0, "shared_rate must be positive"),
    ],
)
def test_sharing_limits_are_validated(field: str, value: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Limits(**{field: value})
