"""The dispatch loop's sliding window of offers: order, bound, refusal and failure."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any, cast

import pytest

from tunnel_server.agents.registry import AgentConnection
from tunnel_server.commands.dispatcher import OFFER_WINDOW, CommandDispatcher
from tunnel_server.store.base import StoreError
from tunnel_server.store.commands import CommandRecord

from ..support import until

NOW = datetime(2026, 11, 22, tzinfo=UTC)


def record(number: int) -> CommandRecord:
    return CommandRecord(
        id=f"cmd-{number:03}",
        cluster="prod",
        submitter="ann",
        type="query",
        name=f"q{number}",
        spec={},
        state="pending",
        attempt=0,
        max_attempts=1,
        timeout_seconds=60.0,
        created_at=NOW,
        updated_at=NOW,
    )


class Pending:
    """The store's pending queue of one cluster; an offer taken leaves it."""

    def __init__(self, count: int) -> None:
        self.records = [record(n) for n in range(count)]

    async def pending_commands(self, cluster: str, limit: int = 100) -> list[CommandRecord]:
        return self.records[:limit]


class Connected:
    """A registry in which the cluster's agent is always connected."""

    def get(self, cluster: str) -> AgentConnection:
        return cast(AgentConnection, object())


class Scripted(CommandDispatcher):
    """Offers held until released, answered as scripted, instead of sent to an agent."""

    def __init__(self, pending: Pending, answers: dict[str, bool | Exception]) -> None:
        super().__init__(
            cast(Any, pending), cast(Any, Connected()), cast(Any, None), access=cast(Any, None)
        )
        self.pending = pending
        self.answers = answers
        self.started: list[str] = []
        self.finished: list[str] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.release = asyncio.Event()

    async def _offer(self, agent: AgentConnection, record: CommandRecord) -> bool:
        self.started.append(record.id)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        answer = self.answers.get(record.id, True)
        try:
            if answer is True:
                await self.release.wait()
                self.pending.records.remove(record)
            elif isinstance(answer, Exception):
                raise answer
            return answer is True
        finally:
            self.in_flight -= 1
            self.finished.append(record.id)


async def test_offers_start_in_queue_order_and_at_most_a_window_at_a_time() -> None:
    pending = Pending(OFFER_WINDOW + 8)
    dispatcher = Scripted(pending, {})
    dispatching = asyncio.create_task(dispatcher._dispatch_pending("prod"))
    await until(lambda: len(dispatcher.started) == OFFER_WINDOW)
    assert dispatcher.in_flight == OFFER_WINDOW
    dispatcher.release.set()
    await dispatching
    assert dispatcher.started == [f"cmd-{n:03}" for n in range(OFFER_WINDOW + 8)]
    assert dispatcher.most_in_flight == OFFER_WINDOW
    assert pending.records == []


async def test_a_refusal_stops_new_offers_and_lets_those_in_flight_finish() -> None:
    pending = Pending(OFFER_WINDOW + 8)
    dispatcher = Scripted(pending, {"cmd-002": False})
    dispatching = asyncio.create_task(dispatcher._dispatch_pending("prod"))
    await until(lambda: "cmd-002" in dispatcher.finished)
    dispatcher.release.set()
    await dispatching
    # Nothing after the window was offered; everything in flight was answered.
    assert dispatcher.started == [f"cmd-{n:03}" for n in range(OFFER_WINDOW)]
    assert sorted(dispatcher.finished) == dispatcher.started
    assert [r.id for r in pending.records] == ["cmd-002"] + [
        f"cmd-{n:03}" for n in range(OFFER_WINDOW, OFFER_WINDOW + 8)
    ]


async def test_a_failed_offer_cancels_none_in_flight_and_is_raised_as_itself() -> None:
    pending = Pending(OFFER_WINDOW + 8)
    dispatcher = Scripted(pending, {"cmd-002": StoreError("the store is unwell")})
    dispatching = asyncio.create_task(dispatcher._dispatch_pending("prod"))
    await until(lambda: "cmd-002" in dispatcher.finished)
    dispatcher.release.set()
    with pytest.raises(StoreError, match="the store is unwell"):
        await dispatching
    # The other offers in flight were answered and taken, not cancelled half-way.
    assert dispatcher.started == [f"cmd-{n:03}" for n in range(OFFER_WINDOW)]
    assert sorted(dispatcher.finished) == dispatcher.started
    assert [r.id for r in pending.records] == ["cmd-002"] + [
        f"cmd-{n:03}" for n in range(OFFER_WINDOW, OFFER_WINDOW + 8)
    ]
