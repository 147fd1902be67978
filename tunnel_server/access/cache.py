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

from tunnel_server.store.base import Grant, NotFoundError, Store, User, hash_token

__all__ = ["AccessCache"]

V = TypeVar("V")


class _TtlCache(Generic[V]):
    def __init__(self, ttl: float, max_entries: int, clock: Callable[[], float]) -> None:
        self._ttl = ttl
        self._max = max_entries
        self._clock = clock
        self._entries: dict[Hashable, tuple[float, V]] = {}
        #: Counts clears: a value loaded across one is not kept.
        self._clears = 0

    def peek(self, key: Hashable) -> tuple[float, V | None]:
        """(expiry, value) of a live entry, else (0.0, None); never waits."""
        entry = self._entries.get(key)
        if entry is not None and entry[0] > self._clock():
            return entry
        return 0.0, None

    async def get(self, key: Hashable, load: Callable[[], Awaitable[V]]) -> tuple[float, V]:
        """(expiry, value): the live entry's, or a value loaded now and kept until the expiry.

        A value whose load began before a :meth:`clear` may predate the change
        that cleared the cache: it is given to this caller, expired at once
        (nothing remembers it), and not kept.
        """
        now = self._clock()
        entry = self._entries.get(key)
        if entry is not None and entry[0] > now:
            return entry
        clears = self._clears
        value = await load()
        if self._clears != clears:
            return now, value
        if len(self._entries) >= self._max:
            del self._entries[next(iter(self._entries))]
        entry = self._entries[key] = (now + self._ttl, value)
        return entry

    def clear(self) -> None:
        self._entries.clear()
        self._clears += 1


class AccessCache:
    """Cached token -> user and (user, cluster) -> grant lookups.

    The ``lookup_*`` methods also say until when (on :attr:`clock`) the
    answer they give holds: an answer derived from several of them may be
    remembered until the earliest, and while :attr:`generation` is the one
    read before they were asked.
    """

    def __init__(
        self,
        store: Store,
        ttl: float = 5.0,
        max_entries: int = 10_000,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self.clock = clock
        self._users: _TtlCache[User | None] = _TtlCache(ttl, max_entries, clock)
        self._grants: _TtlCache[Grant | None] = _TtlCache(ttl, max_entries, clock)
        self._named: _TtlCache[User | None] = _TtlCache(ttl, max_entries, clock)
        #: Counts invalidations: an answer remembered elsewhere under an older
        #: generation must be asked again.
        self.generation = 0

    async def user_for_token(self, token: str) -> User | None:
        return (await self.lookup_user(token))[1]

    async def grant(self, user: str, cluster: str) -> Grant | None:
        return (await self.lookup_grant(user, cluster))[1]

    async def lookup_user(self, token: str) -> tuple[float, User | None]:
        """(until when the answer holds, the token's user or None)."""
        return await self.lookup_user_by_hash(hash_token(token))

    async def lookup_user_by_hash(self, token_hash: str) -> tuple[float, User | None]:
        """(until when the answer holds, the user of the token with this hash, or None)."""
        entry = self._users.peek(token_hash)
        if entry[0]:
            return entry
        return await self._users.get(token_hash, lambda: self._store.find_user_by_token(token_hash))

    async def may_dispatch(self, user: User, cluster: str) -> bool:
        """Whether ``user`` may send commands to ``cluster``: an admin, or by a grant with
        ``--commands``."""
        if user.is_admin:
            return True
        grant = await self.grant(user.name, cluster)
        return grant is not None and grant.commands

    async def user_named(self, name: str) -> User | None:
        """The user called ``name``, or None if there is none."""

        async def load() -> User | None:
            try:
                return await self._store.get_user(name)
            except NotFoundError:
                return None

        return (await self._named.get(name, load))[1]

    async def lookup_grant(self, user: str, cluster: str) -> tuple[float, Grant | None]:
        """(until when the answer holds, the user's grant on the cluster or None)."""
        # The cached answer without building a loader: every proxied request asks.
        entry = self._grants.peek((user, cluster))
        if entry[0]:
            return entry

        async def load() -> Grant | None:
            try:
                return await self._store.get_grant(user, cluster)
            except NotFoundError:
                return None

        return await self._grants.get((user, cluster), load)

    def invalidate(self) -> None:
        """Forget everything: users, tokens or grants changed."""
        self._users.clear()
        self._grants.clear()
        self._named.clear()
        self.generation += 1
