"""Failed sign-ins, limited per client address and in all.

An API token is 256 bits of randomness, so guessing is hopeless; the limit is
there so that a script hammering the sign-in form costs the server and its
store little, and shows in the log. Kept in each replica's memory: a limit
per replica is still a limit, and needs no write per failure.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

__all__ = ["FailedSignIns"]


class FailedSignIns:
    """At most ``per_address`` failures from one address, and ``overall`` from all, in
    ``window`` seconds; past that, sign-ins wait."""

    def __init__(
        self,
        per_address: int = 5,
        overall: int = 100,
        window: float = 300.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_addresses: int = 10_000,
    ) -> None:
        self._per_address = per_address
        self._overall = overall
        self._window = window
        self._clock = clock
        self._max_addresses = max_addresses
        self._by_address: dict[str, deque[float]] = {}
        self._all: deque[float] = deque()

    def wait(self, address: str) -> float:
        """Seconds before ``address`` may try to sign in again (0: now)."""
        now = self._clock()
        self._expire(self._all, now)
        failures = self._by_address.get(address)
        waits = [0.0]
        if failures is not None:
            self._expire(failures, now)
            if not failures:
                del self._by_address[address]
            elif len(failures) >= self._per_address:
                waits.append(failures[0] + self._window - now)
        if len(self._all) >= self._overall:
            waits.append(self._all[0] + self._window - now)
        return max(waits)

    def failed(self, address: str) -> None:
        """Count a failed sign-in from ``address``."""
        now = self._clock()
        if address not in self._by_address and len(self._by_address) >= self._max_addresses:
            del self._by_address[next(iter(self._by_address))]
        self._by_address.setdefault(address, deque()).append(now)
        self._all.append(now)

    def _expire(self, failures: deque[float], now: float) -> None:
        while failures and failures[0] <= now - self._window:
            failures.popleft()
