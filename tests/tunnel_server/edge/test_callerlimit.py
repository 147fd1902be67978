"""The bound on callers' connections alone: which connection goes, and the count."""

from __future__ import annotations

import pytest

from tunnel_server.edge.callerlimit import CallerConnections


class Connection:
    def __init__(self, name: str) -> None:
        self.name = name
        self.evicted = False

    def evict(self) -> None:
        self.evicted = True

    def __repr__(self) -> str:
        return self.name


def test_connections_within_the_limit_are_admitted_and_counted() -> None:
    callers = CallerConnections(limit=2, per_address=2)
    assert callers.admit()
    assert callers.admit()
    assert (callers.open, callers.evicted, callers.refused) == (2, 0, 0)


def test_past_the_limit_the_connection_idle_the_longest_is_closed_and_no_longer_counted() -> None:
    callers = CallerConnections(limit=2, per_address=2)
    first, second = Connection("first"), Connection("second")
    for connection in (first, second):
        assert callers.admit()
        callers.idle(connection)
    callers.busy(first)
    callers.idle(first)  # idle again after a request: now the most recent
    assert callers.admit()
    assert (first.evicted, second.evicted) == (False, True)
    assert (callers.open, callers.evicted, callers.idle_count) == (2, 1, 1)


def test_a_busy_connection_is_never_closed_to_make_room() -> None:
    callers = CallerConnections(limit=2, per_address=2)
    busy, idle = Connection("busy"), Connection("idle")
    assert callers.admit()  # busy: never marked idle
    assert callers.admit()
    callers.idle(idle)
    assert callers.admit()
    assert (busy.evicted, idle.evicted) == (False, True)


def test_past_the_limit_with_nothing_idle_the_new_connection_is_refused_but_counted() -> None:
    callers = CallerConnections(limit=1, per_address=1)
    assert callers.admit()
    assert not callers.admit()
    assert (callers.open, callers.refused) == (2, 1)
    callers.release()  # the refused one closes after its answer
    assert callers.open == 1


def test_a_refused_connection_left_idle_gives_its_place_to_the_next_refused_in_turn() -> None:
    """So refused connections cannot pile up past the limit while they wait for a request."""
    callers = CallerConnections(limit=1, per_address=1)
    assert callers.admit()
    refused = Connection("refused")
    assert not callers.admit()
    callers.idle(refused)
    assert not callers.admit()
    assert refused.evicted
    assert (callers.open, callers.refused) == (2, 2)  # the busy one and the newcomer


def test_a_refused_connection_closed_after_room_was_made_admits_the_next() -> None:
    callers = CallerConnections(limit=2, per_address=2)
    assert callers.admit()  # busy
    assert callers.admit()  # busy, then closes
    refused = Connection("refused")
    assert not callers.admit()
    callers.idle(refused)
    callers.release()  # one of the busy ones closed: there is room now
    assert callers.admit()
    assert refused.evicted
    assert (callers.open, callers.refused) == (2, 1)


@pytest.mark.parametrize("limit", [0, -1])
def test_the_limit_must_allow_a_connection(limit: int) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        CallerConnections(limit)


def test_half_the_limit_per_address_unless_told_and_never_more_than_the_limit() -> None:
    assert CallerConnections(limit=4096).per_address == 2048
    assert CallerConnections(limit=1).per_address == 1
    assert CallerConnections(limit=10, per_address=3).per_address == 3
    assert CallerConnections(limit=10, per_address=50).per_address == 10
    with pytest.raises(ValueError, match="per address must be at least 1"):
        CallerConnections(limit=10, per_address=0)


def test_past_its_share_an_address_loses_its_own_oldest_idle_connection() -> None:
    callers = CallerConnections(limit=10, per_address=2)
    b_idle, a_first, a_second = Connection("b"), Connection("a1"), Connection("a2")
    assert callers.admit("b")
    callers.idle(b_idle, "b")  # the longest idle of all
    for connection in (a_first, a_second):
        assert callers.admit("a")
        callers.idle(connection, "a")
    assert callers.admit("a")
    assert (b_idle.evicted, a_first.evicted, a_second.evicted) == (False, True, False)
    assert (callers.held("a"), callers.held("b"), callers.open) == (2, 1, 3)
    assert callers.refusal("a") is None


def test_past_its_share_with_nothing_idle_an_address_is_refused_and_others_are_not() -> None:
    callers = CallerConnections(limit=10, per_address=2)
    assert callers.admit("a")
    assert callers.admit("a")
    assert not callers.admit("a")
    assert callers.admit("b")
    assert (callers.refused, callers.refused_per_address) == (1, 1)
    refusal = callers.refusal("a")
    assert refusal is not None
    assert "your address holds 2 connections to the tunnel server" in refusal
    assert callers.refusal("b") is None
    callers.release("a")  # one of the busy ones closed: the refused one may stay
    assert callers.refusal("a") is None
    assert (callers.held("a"), callers.open) == (2, 3)


def test_the_servers_limit_is_told_when_it_is_the_one_reached() -> None:
    callers = CallerConnections(limit=2, per_address=2)
    assert callers.admit("a")
    assert callers.admit("b")
    assert not callers.admit("c")
    refusal = callers.refusal("c")
    assert refusal is not None
    assert "the tunnel server holds 2 caller connections, its limit" in refusal


def test_refused_at_their_shares_at_most_one_connection_is_open_past_the_limit() -> None:
    callers = CallerConnections(limit=4, per_address=2)
    for source in "aabb":
        assert callers.admit(source)  # four busy: two each, the server's bound
    refused_a, refused_b = Connection("ra"), Connection("rb")
    assert not callers.admit("a")
    callers.idle(refused_a, "a")
    assert callers.open == 5  # no other address's idle connection closed for it
    assert not callers.admit("b")
    callers.idle(refused_b, "b")
    assert callers.open == 5
    assert refused_a.evicted
    assert callers.refused_per_address == 2
    callers.release("a")  # one of a's requests ended and its connection closed
    assert callers.admit("c")  # the refused one idle goes, not c
    assert refused_b.evicted


def test_one_refused_at_its_share_is_told_so_though_the_server_is_full_too() -> None:
    callers = CallerConnections(limit=4, per_address=2)
    assert callers.admit("a")
    assert callers.admit("a")
    for name, source in (("b1", "b"), ("c1", "c")):
        assert callers.admit(source)
        callers.idle(Connection(name), source)
    assert not callers.admit("a")
    refusal = callers.refusal("a")
    assert refusal is not None
    assert "your address holds 2 connections" in refusal
    assert callers.refused_per_address == 1
    assert callers.evicted == 0  # nothing of b's or c's closed for a connection refused anyway


def test_past_its_share_an_address_gives_up_as_many_of_its_idle_ones_as_it_must() -> None:
    callers = CallerConnections(limit=10, per_address=2)
    assert callers.admit("a")
    assert callers.admit("a")
    refused, kept_alive = Connection("r"), Connection("k")
    assert not callers.admit("a")
    callers.idle(refused, "a")
    callers.idle(kept_alive, "a")  # its request ended: idle between requests
    assert callers.admit("a")
    assert (refused.evicted, kept_alive.evicted) == (True, True)
    assert callers.held("a") == 2
