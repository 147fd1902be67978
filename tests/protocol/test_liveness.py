"""Liveness: PING/PONG round trips, keepalive from tick(now), handshake timeout."""

from __future__ import annotations

import pytest

from protocol import (
    Connection,
    ErrorCode,
    ExcessiveLoadError,
    Keepalive,
    KeepaliveTimeoutError,
    Limits,
    PongReceived,
    Side,
)
from protocol.connection import MAX_CONTROL_QUEUE, MAX_OUTSTANDING_PINGS
from protocol.frames import GoAwayFrame, PingFrame, PongFrame

from .pair import Pair, feed, handshaken, of_type, sent_frames

KEEPALIVE = Keepalive(interval=5.0, timeout=3.0)


def assert_went_away(connection: Connection, code: ErrorCode) -> None:
    """The connection's last words were a GOAWAY with ``code``."""
    [goaway] = sent_frames(connection)
    assert isinstance(goaway, GoAwayFrame)
    assert goaway.code == code


def test_round_trip_time_comes_from_the_now_arguments() -> None:
    pair = Pair(now=10.0)

    opaque = pair.client.send_ping(10.0)
    pair.now = 10.1
    pair.send(pair.client)
    pair.now = 10.25
    events = pair.send(pair.server)

    [pong] = events
    assert isinstance(pong, PongReceived)
    assert pong.opaque == opaque
    assert pong.rtt == pytest.approx(0.25)
    assert pair.client.rtt == pytest.approx(0.25)


def test_a_ping_is_answered_with_the_same_opaque_number() -> None:
    server = handshaken()

    assert feed(server, PingFrame(2**64 - 1)) == []
    assert sent_frames(server) == [PongFrame(2**64 - 1)]


def test_an_unsolicited_pong_is_ignored() -> None:
    client = handshaken(Side.CLIENT)

    assert feed(client, PongFrame(12345)) == []
    assert client.rtt is None
    assert not client.closed


def test_only_the_latest_pings_are_remembered() -> None:
    client = handshaken(Side.CLIENT)
    opaques = [client.send_ping(float(i)) for i in range(MAX_OUTSTANDING_PINGS + 10)]

    forgotten = feed(client, *(PongFrame(o) for o in opaques[:10]), now=100.0)
    answered = feed(client, *(PongFrame(o) for o in opaques[10:]), now=100.0)

    assert forgotten == []
    assert [e.opaque for e in of_type(answered, PongReceived)] == opaques[10:]


def test_tick_pings_after_an_interval_of_silence() -> None:
    client = handshaken(Side.CLIENT, keepalive=KEEPALIVE, now=0.0)
    client.tick(0.0)
    assert client.deadline() == 5.0

    client.tick(4.9)
    assert sent_frames(client) == []

    client.tick(5.0)
    [ping] = sent_frames(client)
    assert isinstance(ping, PingFrame)
    assert client.deadline() == 5.0 + 3.0
    client.tick(6.0)
    assert sent_frames(client) == []  # one keepalive PING at a time


def test_tick_raises_keepalive_timeout_without_a_pong() -> None:
    client = handshaken(Side.CLIENT, keepalive=KEEPALIVE, now=0.0)
    client.tick(5.0)
    sent_frames(client)
    client.tick(7.9)

    with pytest.raises(KeepaliveTimeoutError) as error:
        client.tick(8.0)

    assert error.value.code is ErrorCode.TIMEOUT
    assert client.closed
    assert_went_away(client, ErrorCode.TIMEOUT)
    assert client.deadline() is None
    client.tick(100.0)  # a closed connection has nothing left to time out


def test_other_traffic_does_not_stand_in_for_the_pong() -> None:
    client = handshaken(Side.CLIENT, keepalive=KEEPALIVE, now=0.0)
    client.tick(5.0)
    assert [type(f) for f in sent_frames(client)] == [PingFrame]
    feed(client, PingFrame(1), now=6.0)  # the peer talks, but never answers ours

    with pytest.raises(KeepaliveTimeoutError):
        client.tick(8.0)


def test_a_pong_in_time_keeps_the_connection_alive() -> None:
    client = handshaken(Side.CLIENT, keepalive=KEEPALIVE, now=0.0)
    client.tick(5.0)
    [ping] = sent_frames(client)
    assert isinstance(ping, PingFrame)

    events = feed(client, PongFrame(ping.opaque), now=7.5)

    assert events == [PongReceived(ping.opaque, 2.5)]
    client.tick(8.0)
    client.tick(12.4)
    assert sent_frames(client) == []
    assert client.deadline() == 12.5
    client.tick(12.5)
    assert [type(f) for f in sent_frames(client)] == [PingFrame]
    assert not client.closed


def test_received_traffic_postpones_the_keepalive_ping() -> None:
    client = handshaken(Side.CLIENT, keepalive=KEEPALIVE, now=0.0)
    client.tick(0.0)
    feed(client, PongFrame(777), now=4.0)

    client.tick(8.9)
    assert sent_frames(client) == []
    assert client.deadline() == 9.0


def test_handshake_times_out_without_a_hello() -> None:
    client = Connection(Side.CLIENT, keepalive=KEEPALIVE)
    sent_frames(client)
    assert client.deadline() is None  # the clock starts at the first tick
    client.tick(100.0)
    assert client.deadline() == 103.0
    client.tick(102.9)

    with pytest.raises(KeepaliveTimeoutError, match="HELLO") as error:
        client.tick(103.0)

    assert error.value.code is ErrorCode.TIMEOUT
    assert_went_away(client, ErrorCode.TIMEOUT)


def test_a_peer_that_pings_faster_than_it_reads_is_cut_off() -> None:
    server = handshaken(limits=Limits())
    feed(server, *(PingFrame(0) for _ in range(MAX_CONTROL_QUEUE)))

    # A second later: within the peer's allowance of frames (test_allowance.py),
    # but its PONGs are still unread.
    with pytest.raises(ExcessiveLoadError, match="faster than it reads") as error:
        feed(server, PingFrame(0), now=1.0)

    assert error.value.code is ErrorCode.EXCESSIVE_LOAD
    assert_went_away(server, ErrorCode.EXCESSIVE_LOAD)


def test_keepalive_settings_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        Keepalive(interval=0)


PROBING = Keepalive(interval=20.0, timeout=10.0, probe_after=1.0, probe_timeout=2.0)


def test_new_work_for_a_quiet_peer_sends_a_ping_with_it() -> None:
    client = handshaken(Side.CLIENT, keepalive=PROBING, now=0.0)
    client.tick(0.0)

    client.open_stream("http")
    assert not client.probe(0.9)  # heard from 0.9 s ago: no doubt yet
    assert [type(f).__name__ for f in sent_frames(client)] == ["OpenFrame"]

    client.open_stream("http")
    assert client.probe(1.0)

    # The PING follows the OPEN: its PONG says the peer has the stream too.
    assert [type(f).__name__ for f in sent_frames(client)] == ["OpenFrame", "PingFrame"]
    assert client.deadline() == 1.0 + 2.0  # the probe's, well before the keepalive's 20.0


def test_a_probe_not_answered_in_time_fails_the_connection() -> None:
    client = handshaken(Side.CLIENT, keepalive=PROBING, now=0.0)
    client.tick(0.0)
    client.open_stream("http")
    client.probe(5.0)
    sent_frames(client)
    client.tick(6.9)

    with pytest.raises(KeepaliveTimeoutError, match="within 2s") as error:
        client.tick(7.0)

    assert error.value.code is ErrorCode.TIMEOUT
    assert_went_away(client, ErrorCode.TIMEOUT)


def test_a_probe_answered_in_time_keeps_the_connection_and_its_keepalive() -> None:
    client = handshaken(Side.CLIENT, keepalive=PROBING, now=0.0)
    client.tick(0.0)
    client.probe(5.0)
    [ping] = sent_frames(client)
    assert isinstance(ping, PingFrame)

    assert feed(client, PongFrame(ping.opaque), now=6.5) == [PongReceived(ping.opaque, 1.5)]

    client.tick(7.0)
    assert not client.closed
    assert client.deadline() == 6.5 + 20.0  # back to the keepalive's clock


def test_one_probe_at_a_time_and_none_while_the_peer_talks() -> None:
    client = handshaken(Side.CLIENT, keepalive=PROBING, now=0.0)
    client.tick(0.0)
    assert client.probe(5.0)
    assert not client.probe(5.5)  # one already out
    [ping] = sent_frames(client)
    assert isinstance(ping, PingFrame)
    feed(client, PongFrame(ping.opaque), now=6.0)

    assert not client.probe(6.9)  # just heard from
    assert client.probe(7.0)
    assert [type(f) for f in sent_frames(client)] == [PingFrame]


def test_no_probe_before_the_handshake_or_after_the_end() -> None:
    fresh = Connection(Side.CLIENT, keepalive=PROBING)
    assert not fresh.probe(100.0)
    ended = handshaken(Side.CLIENT, keepalive=PROBING, now=0.0)
    ended.close()
    assert not ended.probe(100.0)


@pytest.mark.parametrize("field", ["probe_after", "probe_timeout"])
def test_probe_settings_must_be_positive(field: str) -> None:
    with pytest.raises(ValueError, match="positive"):
        Keepalive(**{field: 0.0})
