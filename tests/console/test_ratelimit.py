"""Failed sign-ins are limited per address and in all, for a window, on a clock of the test's."""

from __future__ import annotations

from tunnel_server.console.ratelimit import FailedSignIns


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_address_waits_after_its_failures_until_the_oldest_leaves_the_window() -> None:
    clock = Clock()
    limit = FailedSignIns(per_address=3, overall=100, window=60.0, clock=clock)
    for _ in range(3):
        assert limit.wait("10.0.0.1") == 0
        limit.failed("10.0.0.1")
        clock.now += 1
    assert limit.wait("10.0.0.1") == 57.0
    assert limit.wait("10.0.0.2") == 0  # another address is not held back
    clock.now += 57
    assert limit.wait("10.0.0.1") == 0


def test_failures_from_everywhere_are_limited_too() -> None:
    clock = Clock()
    limit = FailedSignIns(per_address=5, overall=4, window=60.0, clock=clock)
    for number in range(4):
        limit.failed(f"10.0.0.{number}")
    assert limit.wait("10.0.0.99") == 60.0


def test_the_addresses_remembered_are_bounded() -> None:
    limit = FailedSignIns(per_address=1, overall=10_000, window=60.0, max_addresses=2)
    for number in range(3):
        limit.failed(f"10.0.0.{number}")
    assert limit.wait("10.0.0.0") == 0  # forgotten first
    assert limit.wait("10.0.0.2") > 0
