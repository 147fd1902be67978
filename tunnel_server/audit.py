"""The audit trail's writer: events queue in memory and land in batches.

One proxied request, one event; writing each in its own transaction would
make the disk the proxy's speed limit. The queue is bounded: when it is full,
requests wait for room rather than lose their events.

Recording is the part on every request's path, so it is kept to appending a
tuple to a list (:class:`ProxyAuditRecord` for proxied requests); waking the
writer, batching and encoding happen once per batch, not once per event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

from .store.base import AuditEvent, ProxyAuditRecord, Store, StoreError

__all__ = ["BATCH_DELAY", "AuditWriter"]

#: How long the first event of a batch waits for others to join it.
BATCH_DELAY = 0.05

logger = logging.getLogger(__name__)


class AuditWriter:
    """Batches audit events into the store; owns its one writer task.

    ``max_queue`` bounds the events held in memory (recorders wait beyond
    it); ``max_batch`` bounds the events of each kind one transaction writes.
    """

    def __init__(
        self,
        store: Store,
        *,
        retention: timedelta | None = None,
        max_queue: int = 10_000,
        max_batch: int = 500,
    ) -> None:
        if max_queue < 1 or max_batch < 1:
            raise ValueError("max_queue and max_batch must be at least 1")
        self._store = store
        self._retention = retention
        self._max_queue = max_queue
        self._max_batch = max_batch
        self._events: list[AuditEvent] = []
        self._proxied: list[ProxyAuditRecord] = []
        #: Recorded and not yet written (or given up on), both kinds.
        self._unwritten = 0
        self._writer_waiter: asyncio.Future[None] | None = None
        self._room_waiters: list[asyncio.Future[None]] = []
        self._flush_waiters: list[asyncio.Future[None]] = []
        self._task: asyncio.Task[None] | None = None
        self.written = 0

    @property
    def queued(self) -> int:
        """Events recorded and not yet written."""
        return self._unwritten

    async def record(self, event: AuditEvent | ProxyAuditRecord) -> None:
        """Queue an event (waits only while the queue is full)."""
        while self._unwritten >= self._max_queue:
            waiter = asyncio.get_running_loop().create_future()
            self._room_waiters.append(waiter)
            await waiter
        if type(event) is ProxyAuditRecord:
            self._proxied.append(event)
        else:
            assert isinstance(event, AuditEvent)
            self._events.append(event)
        self._unwritten += 1
        writer = self._writer_waiter
        if writer is not None and not writer.done():
            writer.set_result(None)

    async def flush(self) -> None:
        """Wait until every event recorded so far is written (or given up on)."""
        while self._unwritten:
            waiter = asyncio.get_running_loop().create_future()
            self._flush_waiters.append(waiter)
            await waiter

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
        loop = asyncio.get_running_loop()
        while True:
            if not self._unwritten:
                self._writer_waiter = loop.create_future()
                try:
                    await self._writer_waiter
                finally:
                    self._writer_waiter = None
            if self._unwritten < self._max_batch:
                # Let events gather a moment: one transaction for a burst
                # instead of one per request (the proxy benchmark's c1 CPU).
                await asyncio.sleep(BATCH_DELAY)
            await self._write_batch()

    async def _write_batch(self) -> None:
        limit = self._max_batch
        events, proxied = self._events[:limit], self._proxied[:limit]
        del self._events[:limit], self._proxied[:limit]
        try:
            if proxied:
                self.written += await self._store.add_proxy_audit(proxied)
            if events:
                self.written += await self._store.add_audit_events(events)
        except StoreError as exc:
            logger.error("lost %d audit events: %s", len(events) + len(proxied), exc)
        except Exception:
            # The writer must outlive any one batch: flush() and recorders wait on it.
            logger.exception("lost %d audit events", len(events) + len(proxied))
        finally:
            self._unwritten -= len(events) + len(proxied)
            self._wake_all(self._room_waiters)
            if not self._unwritten:
                self._wake_all(self._flush_waiters)

    @staticmethod
    def _wake_all(waiters: list[asyncio.Future[None]]) -> None:
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        waiters.clear()
