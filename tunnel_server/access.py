"""Short-lived caches of who a token is and what a user may do on a cluster.

Each kubectl request needs both; the store answers in a worker thread, and a
burst of requests should not queue behind it. Entries live ``ttl`` seconds;
changes made through this server's API clear the cache at once, so only
changes made elsewhere (another replica) take up to ``ttl`` to apply.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

from .store.base import Grant, NotFoundError, Store, User, hash_token

__all__ = ["AccessCache"]

V = TypeVar("V")


class _TtlCache(Generic[V]):
    def __init__(self, ttl: float, max_entries: int) -> None:
        self._ttl = ttl
        self._max = max_entries
        self._entries: dict[Hashable, tuple[float, V]] = {}

    def peek(self, key: Hashable) -> tuple[bool, V | None]:
        """(True, value) for a live entry, else (False, None); never waits."""
        entry = self._entries.get(key)
        if entry is not None and entry[0] > time.monotonic():
            return True, entry[1]
        return False, None

    async def get(self, key: Hashable, load: Callable[[], Awaitable[V]]) -> V:
        now = time.monotonic()
        entry = self._entries.get(key)
        if entry is not None and entry[0] > now:
            return entry[1]
        value = await load()
        if len(self._entries) >= self._max:
            del self._entries[next(iter(self._entries))]
        self._entries[key] = (now + self._ttl, value)
        return value

    def expiry(self, key: Hashable) -> float:
        """When the entry for ``key`` expires (monotonic time); 0.0 if there is none."""
        entry = self._entries.get(key)
        return 0.0 if entry is None else entry[0]

    def clear(self) -> None:
        self._entries.clear()


class AccessCache:
    """Cached token -> user and (user, cluster) -> grant lookups."""

    def __init__(self, store: Store, ttl: float = 5.0, max_entries: int = 10_000) -> None:
        self._store = store
        self._users: _TtlCache[User | None] = _TtlCache(ttl, max_entries)
        self._grants: _TtlCache[Grant | None] = _TtlCache(ttl, max_entries)
        #: Counts invalidations: an answer remembered elsewhere under an older
        #: generation must be asked again.
        self.generation = 0

    async def user_for_token(self, token: str) -> User | None:
        token_hash = hash_token(token)
        found, user = self._users.peek(token_hash)
        if found:
            return user
        return await self._users.get(token_hash, lambda: self._store.find_user_by_token(token_hash))

    async def grant(self, user: str, cluster: str) -> Grant | None:
        # The cached answer without building a loader: every proxied request asks.
        found, grant = self._grants.peek((user, cluster))
        if found:
            return grant

        async def load() -> Grant | None:
            try:
                return await self._store.get_grant(user, cluster)
            except NotFoundError:
                return None

        return await self._grants.get((user, cluster), load)

    def valid_until(self, token: str, user: str, cluster: str) -> float:
        """Until when (monotonic time) the cached answers for this token and grant hold.

        An answer built from them may be remembered until then, and while
        :attr:`generation` is unchanged; 0.0 if either is not cached.
        """
        return min(self._users.expiry(hash_token(token)), self._grants.expiry((user, cluster)))

    def invalidate(self) -> None:
        """Forget everything: users, tokens or grants changed."""
        self._users.clear()
        self._grants.clear()
        self.generation += 1
