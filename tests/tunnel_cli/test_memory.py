"""Start-up objects frozen out of the garbage collector's full passes."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from tunnel_cli import freeze_startup_objects


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


class Node:
    """A cyclic object, of the kind only the cyclic collector visits."""

    def __init__(self) -> None:
        self.me = self


def scanned() -> set[int]:
    """The ids of the objects a full collection visits (the frozen ones are not among them)."""
    return {id(obj) for obj in gc.get_objects()}


def test_objects_alive_at_the_call_leave_the_collectors_sight(unfrozen: None) -> None:
    kept = [Node() for _ in range(1000)]
    assert {id(node) for node in kept} <= scanned()
    frozen = freeze_startup_objects()
    assert frozen == gc.get_freeze_count() >= 1000
    assert not {id(node) for node in kept} & scanned()


def test_objects_made_later_are_still_collected(unfrozen: None) -> None:
    freeze_startup_objects()
    later = [Node() for _ in range(10)]
    assert {id(node) for node in later} <= scanned()
    del later
    assert gc.collect() >= 10


def test_garbage_from_start_up_is_collected_not_frozen(unfrozen: None) -> None:
    garbage = [Node() for _ in range(1000)]
    alive_before = len(gc.get_objects())
    del garbage
    # The unreachable nodes are collected first: what is frozen is what was alive.
    assert freeze_startup_objects() <= alive_before - 1000
