"""The audit writer: every recorded event lands, in bounded batches, and a full queue waits."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tunnel_server.audit import AuditWriter
from tunnel_server.store import AuditEvent, ProxyAuditRecord, SqliteStore, StoreError

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


class GatedStore(SqliteStore):
    """A real store whose proxy-audit writes wait for a gate, and may be made to fail."""

    gate: asyncio.Event
    entered: asyncio.Event
    #: When set, each proxied batch waits for a permit of its own.
    permits: asyncio.Semaphore | None
    batches: list[int]
    failures: int
    #: Raised from the next proxied batch, ending the writer task.
    fatal: BaseException | None

    async def add_proxy_audit(self, records: Sequence[ProxyAuditRecord]) -> int:
        self.batches.append(len(records))
        self.entered.set()
        await self.gate.wait()
        if self.permits is not None:
            await self.permits.acquire()
        if self.fatal is not None:
            raise self.fatal
        if self.failures:
            self.failures -= 1
            raise StoreError("the disk is full")
        return await super().add_proxy_audit(records)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[GatedStore]:
    store = await GatedStore.open(tmp_path / "state.db")
    assert isinstance(store, GatedStore)
    store.gate = asyncio.Event()
    store.gate.set()
    store.entered = asyncio.Event()
    store.permits = None
    store.batches = []
    store.failures = 0
    store.fatal = None
    yield store
    await store.close()


def proxied(n: int) -> ProxyAuditRecord:
    return ProxyAuditRecord(
        1_714_564_800_000_000 + n, "ann", "prod", f"verb-{n}", "/p", 200, 0, 0, 1
    )


def other(verb: str) -> AuditEvent:
    return AuditEvent(None, NOW, "ann", "prod", "command", verb)


async def test_events_of_both_kinds_are_in_the_store_after_a_flush(store: GatedStore) -> None:
    writer = AuditWriter(store)
    async with writer.running():
        await writer.record(proxied(1))
        await writer.record(other("submit"))
        await writer.record(proxied(2))
        await writer.flush()
        assert writer.queued == 0
        assert writer.written == 3
        verbs = {event.verb for event in await store.list_audit()}
    assert verbs == {"verb-1", "verb-2", "submit"}


async def test_a_flush_with_nothing_recorded_returns_at_once(store: GatedStore) -> None:
    writer = AuditWriter(store)
    async with writer.running():
        await asyncio.wait_for(writer.flush(), 1)
    assert store.batches == []


async def test_no_transaction_writes_more_than_a_batch(store: GatedStore) -> None:
    store.gate.clear()  # hold the writer so that everything queues first
    writer = AuditWriter(store, max_batch=3)
    async with writer.running():
        for n in range(7):
            await writer.record(proxied(n))
        store.gate.set()
        await writer.flush()
        assert len(await store.list_audit()) == 7
    assert max(store.batches) <= 3
    assert sum(store.batches) == 7


async def test_a_full_queue_makes_a_recorder_wait_until_the_writer_makes_room(
    store: GatedStore,
) -> None:
    store.gate.clear()
    writer = AuditWriter(store, max_queue=2, max_batch=2)
    async with writer.running():
        await writer.record(proxied(0))
        await writer.record(proxied(1))
        third = asyncio.create_task(writer.record(proxied(2)))
        # The writer took the two queued events and is held at the gate: the
        # queue still counts them, so the third recorder waits.
        await store.entered.wait()
        assert store.batches == [2]
        assert not third.done()
        assert writer.queued == 2
        store.gate.set()
        await asyncio.wait_for(third, 5)
        await writer.flush()
        assert len(await store.list_audit()) == 3


async def test_a_batch_the_store_refuses_is_given_up_and_the_writer_goes_on(
    store: GatedStore, caplog: pytest.LogCaptureFixture
) -> None:
    store.failures = 1
    writer = AuditWriter(store)
    async with writer.running():
        await writer.record(proxied(0))
        await writer.flush()  # returns: the event is given up, not kept forever
        assert "lost 1 proxied requests' audit events: the disk is full" in caplog.text
        await writer.record(proxied(1))
        await writer.flush()
        assert [event.verb for event in await store.list_audit()] == ["verb-1"]
    assert writer.written == 1


async def test_events_recorded_before_the_end_of_running_are_written(store: GatedStore) -> None:
    writer = AuditWriter(store)
    async with writer.running():
        for n in range(5):
            await writer.record(proxied(n))
    assert len(await store.list_audit()) == 5


@pytest.mark.parametrize(("max_queue", "max_batch"), [(0, 1), (1, 0)])
def test_bounds_below_one_are_refused(store: GatedStore, max_queue: int, max_batch: int) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        AuditWriter(store, max_queue=max_queue, max_batch=max_batch)


async def test_a_flush_waits_for_the_events_before_it_not_for_later_ones(
    store: GatedStore,
) -> None:
    store.permits = asyncio.Semaphore(0)
    writer = AuditWriter(store, max_batch=1)
    async with writer.running():
        await writer.record(proxied(0))
        await store.entered.wait()  # the writer holds the first event
        flushing = asyncio.create_task(writer.flush())
        await writer.record(proxied(1))  # recorded after the flush began
        store.permits.release()  # the first event only
        await asyncio.wait_for(flushing, 5)
        assert writer.queued == 1  # the later event still waits: flush did not
        store.permits.release()
        await writer.flush()
        assert writer.written == 2


async def test_a_failed_proxied_batch_loses_only_its_own_events(
    store: GatedStore, caplog: pytest.LogCaptureFixture
) -> None:
    store.gate.clear()
    store.failures = 1
    writer = AuditWriter(store)
    async with writer.running():
        await writer.record(proxied(0))
        await writer.record(other("grant"))  # taken in the same pass
        store.gate.set()
        await writer.flush()
        assert [event.verb for event in await store.list_audit()] == ["grant"]
    assert "lost 1 proxied requests' audit events" in caplog.text
    assert writer.written == 1


async def test_once_the_writer_has_ended_flush_returns_and_recorders_do_not_wait(
    store: GatedStore, caplog: pytest.LogCaptureFixture
) -> None:
    store.fatal = asyncio.CancelledError()  # ends the writer task from inside a batch
    writer = AuditWriter(store, max_queue=1)
    async with writer.running():
        await writer.record(proxied(0))
        await asyncio.wait_for(writer.flush(), 5)
        for n in range(3):  # beyond max_queue: dropped, not waited for
            await asyncio.wait_for(writer.record(proxied(n)), 5)
    assert writer.dropped == 3
    assert "the audit writer has stopped" in caplog.text
