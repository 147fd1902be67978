"""The policy that admits accepted connections to TLS handshakes (no I/O)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from tunnel_server.edge.handshakes import HandshakeAdmission, Schedule, _Tally, source_of

A = "192.0.2.1"
B = "192.0.2.2"
C = "192.0.2.3"


def admitted(
    admission: HandshakeAdmission[str], *names_hosts: tuple[str, str], ready: bool = True
) -> None:
    for name, host in names_hosts:
        assert admission.accepted(name, host) is None
        if ready:
            admission.ready(name)


def test_a_source_is_an_ipv4_address_or_an_ipv6_48() -> None:
    assert source_of("192.0.2.7") == "192.0.2.7"
    # A site's /48 is one source, however many /64s it holds.
    assert source_of("2001:db8:1:2::1") == "2001:db8:1::/48"
    assert source_of("2001:db8:1:ff00::9") == "2001:db8:1::/48"
    assert source_of("2001:db8:2::1") != source_of("2001:db8:1::1")
    assert source_of("::ffff:192.0.2.7") == "192.0.2.7"
    assert source_of("fe80::1%eth0") == "fe80::/48"
    assert source_of("not an address") == "not an address"


def test_a_connection_waiting_for_its_client_hello_takes_no_slot() -> None:
    admission: HandshakeAdmission[str] = HandshakeAdmission(handshakes=1)
    admitted(admission, ("silent", A), ready=False)
    assert admission.schedule(0.0).start == []
    admitted(admission, ("talker", B))
    assert admission.schedule(0.0).start == ["talker"]
    assert (admission.waiting, admission.queued, admission.in_progress) == (1, 0, 1)


def test_handshakes_are_bounded_and_a_finished_one_frees_its_slot() -> None:
    admission: HandshakeAdmission[str] = HandshakeAdmission(handshakes=2)
    admitted(admission, ("a1", A), ("a2", A), ("a3", A))
    assert admission.schedule(0.0).start == ["a1", "a2"]
    assert admission.schedule(0.0).start == []
    admission.finished("a1")
    assert admission.schedule(0.0).start == ["a3"]
    assert (admission.queued, admission.in_progress) == (0, 2)


def test_free_slots_go_to_sources_in_turn() -> None:
    admission: HandshakeAdmission[str] = HandshakeAdmission(handshakes=1)
    admitted(admission, ("a1", A), ("a2", A), ("a3", A), ("b1", B), ("c1", C))
    order = []
    for _ in range(5):
        (started,) = admission.schedule(0.0).start
        order.append(started)
        admission.finished(started)
    assert order == ["a1", "b1", "c1", "a2", "a3"]


def test_past_the_bound_the_busiest_source_loses_its_oldest_waiting_connection() -> None:
    admission: HandshakeAdmission[str] = HandshakeAdmission(handshakes=1, held=4)
    admitted(admission, ("b1", B), ready=False)
    admitted(admission, ("a1", A), ("a2", A))  # queued: kept before waiting ones
    admitted(admission, ("a3", A), ready=False)
    assert admission.accepted("c1", C) == "a3"
    assert admission.accepted("a4", A) == "a4"  # A's only waiting one is the newcomer
    assert admission.accepted("c2", C) == "a1"  # then A's queued ones, oldest first
    assert admission.closed_for_room == 3
    assert (admission.waiting, admission.queued) == (3, 1)
    assert admission.schedule(0.0).start == ["a2"]


def test_a_stalled_handshake_is_abandoned_for_a_lighter_source_after_the_grace() -> None:
    admission: HandshakeAdmission[str] = HandshakeAdmission(handshakes=2, grace=2.0)
    admitted(admission, ("a1", A))
    admission.schedule(10.0)
    admitted(admission, ("a2", A))
    admission.schedule(11.0)
    admitted(admission, ("b1", B))
    early = admission.schedule(11.5)
    assert (early.start, early.abandon, early.recheck_at) == ([], [], 12.0)
    late = admission.schedule(12.0)
    assert (late.start, late.abandon, late.recheck_at) == (["b1"], ["a1"], None)
    assert admission.abandoned == 1
    admission.finished("a1")  # its task ends later: nothing more to do
    assert admission.in_progress == 2


def test_a_source_never_abandons_its_own_handshakes_or_an_equal_ones() -> None:
    admission: HandshakeAdmission[str] = HandshakeAdmission(handshakes=2, grace=1.0)
    admitted(admission, ("a1", A), ("a2", A))
    assert admission.schedule(0.0).start == ["a1", "a2"]
    admitted(admission, ("a3", A))
    assert admission.schedule(100.0) == Schedule([], [], None)
    admission.finished("a1")
    assert admission.schedule(100.0).start == ["a3"]
    admitted(admission, ("b1", B), ("b2", B))
    # A holds both slots: B takes A's oldest, long past its grace.
    assert admission.schedule(100.5) == Schedule(["b1"], ["a2"], None)
    # A and B hold one each: neither abandons the other's.
    assert admission.schedule(200.0) == Schedule([], [], None)


def test_a_source_holding_no_slot_is_not_kept_behind_ones_that_hold_some() -> None:
    admission: HandshakeAdmission[str] = HandshakeAdmission(handshakes=2, grace=1.0)
    admitted(admission, ("a1", A), ("b1", B))
    admission.schedule(0.0)
    admitted(admission, ("a2", A), ("b2", B), ("c1", C))
    # C, holding none, takes A's slot (A's came first); then A, holding none
    # now, takes B's; B waits until C's handshake has had its grace.
    assert admission.schedule(5.0) == Schedule(["c1", "a2"], ["a1", "b1"], 6.0)
    assert admission.schedule(6.0) == Schedule(["b2"], ["c1"], None)


def test_the_oldest_of_the_addresses_holding_the_most_is_abandoned() -> None:
    admission: HandshakeAdmission[str] = HandshakeAdmission(handshakes=4, grace=2.0)
    for name, host, now in [("b1", B, 0.0), ("a1", A, 1.0), ("a2", A, 1.5), ("b2", B, 1.6)]:
        admitted(admission, (name, host))
        admission.schedule(now)
    admitted(admission, ("c1", C))
    # A reached two slots first, but B's b1 is the one past its grace.
    assert admission.schedule(2.0) == Schedule(["c1"], ["b1"], None)


def test_out_of_room_the_busiest_address_gives_one_back() -> None:
    admission: HandshakeAdmission[str] = HandshakeAdmission(handshakes=1)
    assert admission.make_room() is None
    admitted(admission, ("b1", B), ready=False)
    admitted(admission, ("a1", A), ("a2", A), ready=False)
    assert admission.make_room() == "a1"
    assert admission.make_room() in {"a2", "b1"}
    assert admission.closed_for_room == 2
    assert admission.waiting == 1


def test_a_connection_gone_before_its_handshake_is_forgotten() -> None:
    admission: HandshakeAdmission[str] = HandshakeAdmission(handshakes=1)
    admitted(admission, ("a1", A), ("a2", A))
    admitted(admission, ("b1", B), ready=False)
    admission.gone("b1", timed_out=True)
    admission.gone("a2")
    assert admission.schedule(0.0).start == ["a1"]
    admission.gone("a1")  # started: gone does not apply
    admission.gone("never accepted")
    assert (admission.waiting, admission.queued, admission.in_progress) == (0, 0, 1)
    assert admission.timed_out == 1
    admission.finished("a1")
    assert admission.in_progress == 0
    assert admission.schedule(0.0).start == []


@pytest.mark.parametrize(("handshakes", "held", "grace"), [(0, 1, 1.0), (1, 0, 1.0), (1, 1, 0.0)])
def test_bounds_must_be_positive(handshakes: int, held: int, grace: float) -> None:
    with pytest.raises(ValueError, match="must be"):
        HandshakeAdmission(handshakes, held, grace)


def test_the_tally_knows_its_heaviest_source_through_any_sequence() -> None:
    rng = random.Random(7)
    tally = _Tally()
    counts: Counter[str] = Counter()
    for _ in range(5000):
        source = rng.choice("abcdef")
        if counts[source] and rng.random() < 0.5:
            tally.remove(source)
            counts[source] -= 1
        else:
            tally.add(source)
            counts[source] += 1
        most = max(counts.values(), default=0)
        heaviest = tally.heaviest()
        if most == 0:
            assert heaviest is None
        else:
            assert heaviest is not None
            assert counts[heaviest] == most
        assert all(tally[s] == counts[s] for s in "abcdef")
