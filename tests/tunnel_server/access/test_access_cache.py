"""The access cache: an answer loaded across a change is used once, never kept."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import cast

from tunnel_server.access.cache import AccessCache
from tunnel_server.store.base import Store, User

from ...support import ManualClock

ALICE = User("alice", ("platform",), False, datetime(2026, 1, 1, tzinfo=UTC))


class SlowStore:
    """Answers who a token is when the test lets it; counts the questions."""

    def __init__(self) -> None:
        self.asked = 0
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()

    async def find_user_by_token(self, token_hash: str) -> User | None:
        self.asked += 1
        self.entered.set()
        await self.gate.wait()
        return ALICE


async def test_an_answer_loaded_across_an_invalidation_is_given_expired_and_not_kept() -> None:
    store = SlowStore()
    access = AccessCache(cast(Store, store), ttl=5.0, clock=ManualClock(100.0))
    loading = asyncio.create_task(access.lookup_user_by_hash("hash"))
    await store.entered.wait()
    access.invalidate()  # the user changed while the store was answering
    store.gate.set()

    until, user = await loading

    assert (until, user) == (100.0, ALICE)  # this caller's answer, good for nothing more
    await access.lookup_user_by_hash("hash")
    assert store.asked == 2


async def test_an_answer_loaded_with_nothing_changing_is_kept_for_its_time_to_live() -> None:
    store = SlowStore()
    store.gate.set()
    access = AccessCache(cast(Store, store), ttl=5.0, clock=ManualClock(100.0))

    assert await access.lookup_user_by_hash("hash") == (105.0, ALICE)
    assert await access.lookup_user_by_hash("hash") == (105.0, ALICE)
    assert store.asked == 1
