"""The audit trail's writer: events queue in memory and land in batches.

One proxied request, one event; writing each in its own transaction would
make the disk the proxy's speed limit. The queue is bounded: when it is full,
requests wait for room rather than lose their events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

from .store.base import AuditEvent, Store, StoreError

__all__ = ["BATCH_DELAY", "AuditWriter"]

#: How long the first event of a batch waits for others to join it.
BATCH_DELAY = 0.05

logger = logging.getLogger(__name__)


class AuditWriter:
    """Batches audit events into the store; owns its one writer task."""

    def __init__(
        self,
        store: Store,
        *,
        retention: timedelta | None = None,
        max_queue: int = 10_000,
        max_batch: int = 500,
    ) -> None:
        self._store = store
        self._retention = retention
        self._queue: asyncio.Queue[AuditEvent] = asyncio.Queue(max_queue)
        self._max_batch = max_batch
        self._task: asyncio.Task[None] | None = None
        self.written = 0

    async def record(self, event: AuditEvent) -> None:
        """Queue an event (waits only when the queue is full)."""
        try:
            self._queue.put_nowait(event)  # one per proxied request: no coroutine
        except asyncio.QueueFull:
            await self._queue.put(event)

    async def flush(self) -> None:
        """Wait until every queued event is written."""
        await self._queue.join()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Write while the block runs; flush what is queued at its end."""
        self._task = asyncio.create_task(self._write_forever(), name="audit writer")
        pruner = asyncio.create_task(self._prune_forever(), name="audit pruner")
        try:
            yield
        finally:
            await self.flush()
            self._task.cancel()
            pruner.cancel()
            await asyncio.gather(self._task, pruner, return_exceptions=True)

    async def _prune_forever(self) -> None:
        """Forget events older than the retention, hourly (the trail stays bounded)."""
        if self._retention is None:
            return
        while True:
            try:
                removed = await self._store.delete_audit_before(datetime.now(UTC) - self._retention)
            except StoreError as exc:
                logger.error("cannot prune the audit trail: %s", exc)
            else:
                if removed:
                    logger.info("pruned %d audit events older than the retention", removed)
            await asyncio.sleep(3600)

    async def _write_forever(self) -> None:
        while True:
            batch = [await self._queue.get()]
            if self._queue.qsize() < self._max_batch:
                # Let events gather a moment: one transaction for a burst
                # instead of one per request (the proxy benchmark's c1 CPU).
                await asyncio.sleep(BATCH_DELAY)
            while len(batch) < self._max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                self.written += await self._store.add_audit_events(batch)
            except StoreError as exc:
                logger.error("lost %d audit events: %s", len(batch), exc)
            finally:
                for _ in batch:
                    self._queue.task_done()
