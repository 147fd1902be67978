"""Reconnect delays: exponential, with full jitter and a cap.

Full jitter (a uniform draw between zero and the exponential bound) spreads a
fleet that lost its server at the same moment, so that they do not return in
waves. The bound resets only after a connection has stayed up a while, so a
server that accepts and then drops connections still sees growing delays.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

__all__ = ["Backoff"]


@dataclass(slots=True)
class Backoff:
    """Delays for successive attempts; ``rng`` is injectable for tests."""

    base: float = 1.0
    cap: float = 300.0
    #: A connection up this long counts as stable and resets the delays.
    stable_after: float = 30.0
    rng: random.Random = field(default_factory=random.Random)
    attempt: int = 0

    def next_delay(self, retry_after: float | None = None) -> float:
        """The wait before the next attempt; at least ``retry_after`` if the server asked."""
        bound = min(self.cap, self.base * 2**self.attempt)
        self.attempt = min(self.attempt + 1, 64)
        delay = self.rng.uniform(0.0, bound)
        if retry_after is not None:
            # The server already spread its answer; obey it, plus a little jitter.
            delay = min(self.cap, max(delay, retry_after + self.rng.uniform(0.0, retry_after / 10)))
        return delay

    def connection_ended(self, uptime: float) -> None:
        """Record how long the last connection stayed up."""
        if uptime >= self.stable_after:
            self.attempt = 0
