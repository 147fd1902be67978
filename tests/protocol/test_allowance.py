"""The peer's allowance of frames that carry no data (protocol/allowance.py).

A WINDOW, PING, RESET or empty DATA costs its receiver about a thousand times
what a DATA frame costs per byte; a peer that floods them is cut off, a peer
that sends them in answer to this side's traffic never is.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import pytest

from protocol import (
    Connection,
    DataReceived,
    ErrorCode,
    ExcessiveLoadError,
    Limits,
    Side,
    StreamOpened,
)
from protocol.allowance import (
    ALLOWANCE_CAP,
    ALLOWANCE_PER_SECOND,
    ALLOWANCE_START,
    ControlAllowance,
)
from protocol.frames import (
    DataFrame,
    Frame,
    GoAwayFrame,
    MessageFrame,
    OpenFrame,
    PingFrame,
    PongFrame,
    ResetFrame,
    WindowFrame,
    encode_message,
)

from .pair import Pair, feed, hello, of_type, sent_frames

#: Frames a hand-played peer sends per message.
PER_MESSAGE = 1000
#: The most of the allowance the set-ups below spend (an OPEN, a RESET).
SET_UP = 10


def flood(connection: Connection, frames: Iterator[Frame], count: int, now: float = 0.0) -> None:
    """Feed ``count`` of ``frames``, reading what the connection answers after each message."""
    while count:
        batch = list(itertools.islice(frames, min(PER_MESSAGE, count)))
        feed(connection, *batch, now=now)
        connection.data_to_send()
        count -= len(batch)


def with_stream(limits: Limits | None = None) -> Connection:
    """A server that takes ``http`` streams, whose hand-played client has opened stream 1."""
    server = Connection(Side.SERVER, limits, stream_kinds={"http"})
    sent_frames(server)
    feed(server, hello())
    assert of_type(feed(server, OpenFrame(1, "http", {})), StreamOpened)
    server.data_to_send()
    return server


def with_ended_stream() -> Connection:
    """A server on which the client opened stream 1 and reset it."""
    server = with_stream()
    feed(server, ResetFrame(1, ErrorCode.CANCEL))
    return server


def refused_opens() -> Iterator[Frame]:
    """OPENs the server refuses: it takes one stream at a time, and stream 1 is open."""
    return (OpenFrame(stream_id, "http", {}) for stream_id in itertools.count(3, 2))


def opens_of_a_kind_not_taken() -> Iterator[Frame]:
    """OPENs the server refuses: it takes only ``http`` streams."""
    return (OpenFrame(stream_id, "shell", {}) for stream_id in itertools.count(3, 2))


def opens() -> Iterator[Frame]:
    """OPENs the server accepts, up to its 2,048 streams, and refuses after."""
    return (OpenFrame(stream_id, "http", {}) for stream_id in itertools.count(3, 2))


def rapid_resets() -> Iterator[Frame]:
    """Streams opened and reset at once (HTTP/2's "rapid reset", CVE-2023-44487)."""
    for stream_id in itertools.count(3, 2):
        yield OpenFrame(stream_id, "http", {})
        yield ResetFrame(stream_id, ErrorCode.CANCEL)


#: Each kind of frame that carries no data: the server it goes to, and the frames.
FLOODS: dict[str, tuple[Callable[[], Connection], Callable[[], Iterator[Frame]]]] = {
    "WINDOW on a stream": (with_stream, lambda: itertools.repeat(WindowFrame(1, 1))),
    "WINDOW on the connection": (with_stream, lambda: itertools.repeat(WindowFrame(0, 1))),
    "PING": (with_stream, lambda: itertools.repeat(PingFrame(7))),
    "PONG never asked for": (with_stream, lambda: itertools.repeat(PongFrame(7))),
    "RESET of an ended stream": (
        with_ended_stream,
        lambda: itertools.repeat(ResetFrame(1, ErrorCode.CANCEL)),
    ),
    "empty DATA on an ended stream": (
        with_ended_stream,
        lambda: itertools.repeat(DataFrame(1, b"")),
    ),
    "END on an ended stream": (
        with_ended_stream,
        lambda: itertools.repeat(DataFrame(1, b"", end_stream=True)),
    ),
    "empty DATA": (with_stream, lambda: itertools.repeat(DataFrame(1, b""))),
    "MESSAGE": (with_stream, lambda: itertools.repeat(MessageFrame("note", {}))),
    "GOAWAY without an error": (
        with_stream,
        lambda: itertools.repeat(GoAwayFrame(0, ErrorCode.NO_ERROR)),
    ),
    "refused OPEN": (lambda: with_stream(Limits(max_streams=1)), refused_opens),
    "OPEN of a kind not taken": (with_stream, opens_of_a_kind_not_taken),
    "OPEN": (with_stream, opens),
    "OPEN and RESET": (with_stream, rapid_resets),
}


@pytest.mark.parametrize("kind", FLOODS)
def test_a_flood_of_frames_without_data_ends_the_connection(kind: str) -> None:
    make_server, make_frames = FLOODS[kind]
    server = make_server()
    frames = make_frames()
    # Its allowance, before this side sent anything, less what setting up took.
    flood(server, frames, ALLOWANCE_START - SET_UP)

    with pytest.raises(ExcessiveLoadError, match="frames without data") as error:
        flood(server, frames, 2 * SET_UP)

    assert error.value.code is ErrorCode.EXCESSIVE_LOAD
    assert server.closed
    [goaway] = sent_frames(server)
    assert isinstance(goaway, GoAwayFrame)
    assert goaway.code == ErrorCode.EXCESSIVE_LOAD


def test_time_adds_to_the_allowance() -> None:
    server = with_stream()
    frames = itertools.repeat(WindowFrame(1, 1))
    flood(server, frames, ALLOWANCE_START - SET_UP, now=0.0)

    flood(server, frames, 10 * ALLOWANCE_PER_SECOND, now=10.0)  # ten seconds' worth

    with pytest.raises(ExcessiveLoadError):
        flood(server, frames, 2 * SET_UP, now=10.0)


def test_goaways_before_the_hello_spend_the_allowance() -> None:
    server = Connection(Side.SERVER)
    sent_frames(server)

    with pytest.raises(ExcessiveLoadError):
        flood(server, itertools.repeat(GoAwayFrame(0, ErrorCode.NO_ERROR)), ALLOWANCE_START + 1)


def test_a_peer_spending_just_under_the_rate_of_time_is_never_cut() -> None:
    allowance = ControlAllowance()
    allowance.since = 0.0
    for _ in range(ALLOWANCE_START):
        allowance.spend(0.0)
    # 93.75 frames a second, in ones and twos every 16 ms: the fractions add up.
    now = 0.0
    for step in range(1000):
        now += 0.016
        for _ in range(1 + step % 2):
            allowance.spend(now)


def test_what_a_peer_may_save_up_is_capped() -> None:
    allowance = ControlAllowance()
    allowance.earn(10**9)

    for _ in range(ALLOWANCE_CAP):
        allowance.spend(0.0)
    with pytest.raises(ExcessiveLoadError):
        allowance.spend(0.0)


def test_a_peer_answering_a_long_transfer_with_windows_is_never_cut_off() -> None:
    # The client grants 4 KiB per stream: the server's DATA frames are small and
    # the client returns credit for every KiB it reads, so the server receives
    # far more WINDOWs than its starting allowance (64 MiB / 1 KiB = 65,536).
    pair = Pair(client=Connection(Side.CLIENT, Limits(initial_window=4096)))
    stream_id = pair.client.open_stream("http", {}, end_stream=True)
    pair.exchange()
    messages_before = pair.server.stats.messages_received
    remaining = 64 * 1024 * 1024
    chunk = bytes(4096)
    while remaining:
        size = min(pair.server.send_capacity(stream_id), remaining, len(chunk))
        pair.server.send_data(stream_id, chunk[:size])
        remaining -= size
        for event in pair.send(pair.server):
            if isinstance(event, DataReceived):
                for offset in range(0, len(event.data), 1024):
                    pair.client.acknowledge_data(stream_id, len(event.data[offset : offset + 1024]))
        pair.send(pair.client)  # its WINDOWs

    assert not pair.server.closed
    # At least one WINDOW in each message the client sent.
    assert pair.server.stats.messages_received - messages_before > ALLOWANCE_START


def test_resetting_streams_whose_credit_the_peer_had_spent_in_small_frames_costs_nothing() -> None:
    # A kubectl logs -f given up: the agent had sent the stream's whole credit
    # in small frames (log lines), which arrive after this side's RESET.
    pair = Pair()
    line = b"x" * 512
    for _ in range(2 * ALLOWANCE_START // (1024 * 1024 // len(line))):
        stream_id = pair.client.open_stream("http", {}, end_stream=True)
        pair.send(pair.client)
        in_flight: list[bytes] = []
        for _ in range(1024 * 1024 // len(line)):  # its whole credit, as 2,048 frames
            pair.server.send_data(stream_id, line)
            in_flight += pair.server.data_to_send()
        pair.client.reset_stream(stream_id)
        for message in in_flight:
            assert pair.client.receive_data(message, pair.now) == []  # dropped
        pair.exchange()

    assert not pair.client.closed
    assert not pair.server.closed


def test_frames_with_maps_of_many_small_items_spend_by_the_kib() -> None:
    # Two MESSAGEs of 15,000 small integers fill a message and take about a
    # millisecond to decode: at one each, 10,000 would be five seconds of CPU.
    server = with_stream()
    heavy = encode_message([MessageFrame("note", {"items": list(range(100)) * 150})] * 2)

    def heavy_messages() -> int:
        """How many of them the server takes before it ends the connection."""
        for taken in range(ALLOWANCE_START):
            try:
                server.receive_data(heavy, 0.0)
            except ExcessiveLoadError:
                return taken
        return ALLOWANCE_START

    assert heavy_messages() < ALLOWANCE_START // 30  # about 33 spent each


def test_ordinary_requests_are_paid_for_by_their_answers() -> None:
    # An agent's side: OPENs with a request's headers (about 600 bytes each)
    # spend its allowance, twice over what it starts with; answers earn it back.
    pair = Pair()
    headers = {"method": "GET", "path": "/api/v1/pods", "headers": [["x-header", "v" * 40]] * 12}
    for _ in range(2 * ALLOWANCE_START // 16):
        ids = [pair.server.open_stream("http", headers, end_stream=True) for _ in range(16)]
        for event in pair.send(pair.server):
            assert not isinstance(event, DataReceived)
        for stream_id in ids:
            pair.client.send_data(stream_id, b'{"kind":"PodList"}', end_stream=True)
        pair.exchange()

    assert not pair.client.closed
    assert pair.client.stats.streams_opened == 2 * ALLOWANCE_START


def test_an_allowance_not_enforced_is_counted_and_never_ends_the_connection() -> None:
    # The agent's side: it trusts the server with its availability.
    agent = Connection(Side.CLIENT, enforce_allowance=False)
    sent_frames(agent)
    feed(agent, hello())

    flood(agent, itertools.repeat(PingFrame(7)), 3 * ALLOWANCE_START)

    assert not agent.closed
