"""Reconnect delays: exponential bound, full jitter, cap, reset, and the server's Retry-After."""

from __future__ import annotations

import random
import statistics
from collections import Counter

from tunnel_agent.backoff import Backoff


class RecordingRandom(random.Random):
    """A seeded Random that remembers the bounds of each uniform draw."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.bounds: list[tuple[float, float]] = []

    def uniform(self, a: float, b: float) -> float:
        self.bounds.append((a, b))
        return super().uniform(a, b)


class NoJitter(random.Random):
    """Always the top of the range: a fleet that backs off in lockstep."""

    def uniform(self, a: float, b: float) -> float:
        return b


def test_delays_stay_between_zero_and_the_exponential_bound() -> None:
    for seed in range(20):
        backoff = Backoff(base=0.5, cap=60.0, rng=random.Random(seed))
        for attempt in range(30):
            delay = backoff.next_delay()
            assert 0.0 <= delay <= min(60.0, 0.5 * 2**attempt)


def test_bound_doubles_with_each_attempt_until_the_cap() -> None:
    rng = RecordingRandom(1)
    backoff = Backoff(base=1.0, cap=300.0, rng=rng)
    for _ in range(12):
        backoff.next_delay()
    lows = {low for low, _ in rng.bounds}
    highs = [high for _, high in rng.bounds]
    assert lows == {0.0}  # full jitter: every draw starts at zero
    assert highs == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]


def test_attempt_count_stays_bounded_after_very_many_failures() -> None:
    backoff = Backoff(base=1.0, cap=300.0, rng=random.Random(2))
    delays = [backoff.next_delay() for _ in range(10_000)]
    assert backoff.attempt == 64
    assert max(delays) <= 300.0


def test_full_jitter_spreads_draws_over_the_whole_range() -> None:
    backoff = Backoff(base=1.0, cap=300.0, rng=random.Random(3))
    bound = 16.0
    draws = []
    for _ in range(1000):
        backoff.attempt = 4  # bound 1 * 2**4
        draws.append(backoff.next_delay())
    assert min(draws) >= 0.0
    assert max(draws) <= bound
    assert min(draws) < 0.05 * bound  # some come back almost at once ...
    assert max(draws) > 0.95 * bound  # ... some wait nearly the whole bound
    assert abs(statistics.fmean(draws) - bound / 2) < 0.05 * bound
    # Every tenth of the range gets its share (about 100 each), not a clump.
    tenths = Counter(min(int(draw / bound * 10), 9) for draw in draws)
    assert sorted(tenths) == list(range(10))
    assert min(tenths.values()) > 60


def test_a_stable_connection_resets_the_delays() -> None:
    rng = RecordingRandom(4)
    backoff = Backoff(base=1.0, cap=300.0, stable_after=30.0, rng=rng)
    for _ in range(6):
        backoff.next_delay()
    backoff.connection_ended(uptime=30.0)
    assert backoff.attempt == 0
    backoff.next_delay()
    assert rng.bounds[-1] == (0.0, 1.0)


def test_a_short_lived_connection_does_not_reset_the_delays() -> None:
    rng = RecordingRandom(5)
    backoff = Backoff(base=1.0, cap=300.0, stable_after=30.0, rng=rng)
    for _ in range(6):
        backoff.next_delay()
    # A server that accepts and then drops connections still sees growing delays.
    backoff.connection_ended(uptime=29.9)
    assert backoff.attempt == 6
    backoff.next_delay()
    assert rng.bounds[-1] == (0.0, 64.0)


def test_retry_after_is_a_floor_with_a_little_jitter() -> None:
    for seed in range(200):
        backoff = Backoff(base=0.01, cap=300.0, rng=random.Random(seed))
        delay = backoff.next_delay(retry_after=7.0)
        assert 7.0 <= delay <= 7.0 * 1.1


def test_retry_after_never_lowers_a_longer_backoff() -> None:
    backoff = Backoff(base=1.0, cap=300.0, rng=NoJitter())
    backoff.attempt = 6  # the bound, and with NoJitter the delay, is 64 s
    assert backoff.next_delay(retry_after=2.0) == 64.0


def test_retry_after_is_capped_by_the_cap() -> None:
    backoff = Backoff(base=1.0, cap=5.0, rng=random.Random(6))
    assert backoff.next_delay(retry_after=60.0) == 5.0


def reconnection_times(rngs: list[random.Random], server_back_at: float) -> list[float]:
    """When each agent of a fleet reconnects, all having lost the server at t=0.

    Each agent follows the agent's loop (connection_ended, then next_delay);
    every attempt before ``server_back_at`` fails at once (connection refused).
    """
    times = []
    for rng in rngs:
        backoff = Backoff(base=1.0, cap=300.0, stable_after=30.0, rng=rng)
        backoff.connection_ended(uptime=3600.0)  # they had been connected for an hour
        now = 0.0
        while True:
            now += backoff.next_delay()
            if now >= server_back_at:
                times.append(now)
                break
            backoff.connection_ended(uptime=0.0)
    return times


def busiest_second(times: list[float], start: float, seconds: int) -> int:
    per_second = Counter(int(t - start) for t in times if start <= t < start + seconds)
    return max(per_second.values())


def test_jitter_spreads_a_fleet_returning_to_a_restarted_server() -> None:
    fleet = 2000
    back = 20.0
    times = reconnection_times([random.Random(seed) for seed in range(fleet)], back)
    # No second of the first minute after the server returns sees a quarter of the fleet.
    assert busiest_second(times, back, 60) < fleet // 4
    # And the spreading does not strand the fleet: nearly all are back within the minute.
    assert sum(t < back + 60 for t in times) >= 0.9 * fleet
    # Without jitter the same fleet arrives in one single second: the check has teeth.
    lockstep = reconnection_times([NoJitter() for _ in range(fleet)], back)
    assert busiest_second(lockstep, back, 60) == fleet
