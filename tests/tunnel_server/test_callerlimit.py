"""The bound on callers' connections alone: which connection goes, and the count."""

from __future__ import annotations

import pytest

from tunnel_server.callerlimit import CallerConnections


class Connection:
    def __init__(self, name: str) -> None:
        self.name = name
        self.evicted = False

    def evict(self) -> None:
        self.evicted = True

    def __repr__(self) -> str:
        return self.name


def test_connections_within_the_limit_are_admitted_and_counted() -> None:
    callers = CallerConnections(limit=2)
    assert callers.admit()
    assert callers.admit()
    assert (callers.open, callers.evicted, callers.refused) == (2, 0, 0)


def test_past_the_limit_the_connection_idle_the_longest_is_closed_and_no_longer_counted() -> None:
    callers = CallerConnections(limit=2)
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
    callers = CallerConnections(limit=2)
    busy, idle = Connection("busy"), Connection("idle")
    assert callers.admit()  # busy: never marked idle
    assert callers.admit()
    callers.idle(idle)
    assert callers.admit()
    assert (busy.evicted, idle.evicted) == (False, True)


def test_past_the_limit_with_nothing_idle_the_new_connection_is_refused_but_counted() -> None:
    callers = CallerConnections(limit=1)
    assert callers.admit()
    assert not callers.admit()
    assert (callers.open, callers.refused) == (2, 1)
    callers.release()  # the refused one closes after its answer
    assert callers.open == 1


def test_a_refused_connection_left_idle_gives_its_place_to_the_next_refused_in_turn() -> None:
    """So refused connections cannot pile up past the limit while they wait for a request."""
    callers = CallerConnections(limit=1)
    assert callers.admit()
    refused = Connection("refused")
    assert not callers.admit()
    callers.idle(refused)
    assert not callers.admit()
    assert refused.evicted
    assert (callers.open, callers.refused) == (2, 2)  # the busy one and the newcomer


def test_a_refused_connection_closed_after_room_was_made_admits_the_next() -> None:
    callers = CallerConnections(limit=2)
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
