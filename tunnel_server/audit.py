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
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from tunnel_server.store.base import AuditEvent, ProxyAuditRecord, Store, StoreError

__all__ = ["BATCH_DELAY", "AuditWriter"]

#: How long the first event of a batch waits for others to join it.
BATCH_DELAY = 0.05

logger = logging.getLogger(__name__)

E = TypeVar("E", AuditEvent, ProxyAuditRecord)


class _Pending(Generic[E]):
    """The events of one kind waiting to be written, and their counts."""

    __slots__ = ("done", "items", "recorded", "what")

    def __init__(self, what: str) -> None:
        self.what = what
        self.items: list[E] = []
        #: Recorded, and written or given up on: flush() waits for counts.
        self.recorded = 0
        self.done = 0


class AuditWriter:
    """Batches audit events into the store; owns its one writer task.

    ``max_queue`` bounds the events held in memory (recorders wait beyond
    it); ``max_batch`` bounds the events of each kind one transaction writes.
    """

    def __init__(
        self,
        store: Store,
        *,
        max_queue: int = 10_000,
        max_batch: int = 500,
    ) -> None:
        if max_queue < 1 or max_batch < 1:
            raise ValueError("max_queue and max_batch must be at least 1")
        self._store = store
        self._max_queue = max_queue
        self._max_batch = max_batch
        self._events = _Pending[AuditEvent]("audit events")
        self._proxied = _Pending[ProxyAuditRecord]("proxied requests' audit events")
        self._writer_waiter: asyncio.Future[None] | None = None
        self._room_waiters: list[asyncio.Future[None]] = []
        self._flush_waiters: list[asyncio.Future[None]] = []
        self._task: asyncio.Task[None] | None = None
        #: The writer task has ended: nothing more will be written.
        self._stopped = False
        self.written = 0
        self.dropped = 0

    @property
    def queued(self) -> int:
        """Events recorded and not yet written (nor given up on)."""
        events, proxied = self._events, self._proxied
        return events.recorded - events.done + proxied.recorded - proxied.done

    async def record(self, event: AuditEvent | ProxyAuditRecord) -> None:
        """Queue an event (waits only while the queue is full)."""
        while self.queued >= self._max_queue and not self._stopped:
            waiter = asyncio.get_running_loop().create_future()
            self._room_waiters.append(waiter)
            await waiter
        if self._stopped:
            self._drop()
            return
        if type(event) is ProxyAuditRecord:
            self._proxied.items.append(event)
            self._proxied.recorded += 1
        else:
            assert isinstance(event, AuditEvent)
            self._events.items.append(event)
            self._events.recorded += 1
        writer = self._writer_waiter
        if writer is not None and not writer.done():
            writer.set_result(None)

    async def admin_action(
        self, user: str, verb: str, target: str, cluster: str | None = None
    ) -> None:
        """Queue the event of an admin's change (kind ``admin``): who, what, on what."""
        await self.record(
            AuditEvent(
                id=None,
                time=datetime.now(UTC),
                user=user,
                cluster=cluster,
                kind="admin",
                verb=verb,
                path=target,
            )
        )

    def flush(self) -> Coroutine[Any, Any, None]:
        """Wait until every event recorded before the call is written (or given up on).

        Events recorded after the call, even before the wait begins, do not
        hold it up. Returns at once if the writer has stopped.
        """
        return self._flushed(self._events.recorded, self._proxied.recorded)

    async def _flushed(self, events: int, proxied: int) -> None:
        while not self._stopped and (self._events.done < events or self._proxied.done < proxied):
            waiter = asyncio.get_running_loop().create_future()
            self._flush_waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._flush_waiters:
                    self._flush_waiters.remove(waiter)  # a cancelled flush leaves nothing

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Write while the block runs; flush what is queued at its end."""
        self._task = asyncio.create_task(self._write_forever(), name="audit writer")
        self._task.add_done_callback(self._writer_stopped)
        try:
            yield
        finally:
            try:
                await self.flush()
            finally:
                self._task.cancel()
                await asyncio.gather(self._task, return_exceptions=True)

    async def _write_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self.queued:
                self._writer_waiter = loop.create_future()
                try:
                    await self._writer_waiter
                finally:
                    self._writer_waiter = None
            if self.queued < self._max_batch:
                # Let events gather a moment: one transaction for a burst
                # instead of one per request (the proxy benchmark's c1 CPU).
                await asyncio.sleep(BATCH_DELAY)
            await self._write_batch()

    async def _write_batch(self) -> None:
        # Each kind is taken, written and counted on its own: a failure of one
        # loses only its own events (the others' are security events too).
        try:
            if self._proxied.items:
                await self._write_some(self._proxied, self._store.add_proxy_audit)
            if self._events.items:
                await self._write_some(self._events, self._store.add_audit_events)
        finally:
            self._wake_all(self._room_waiters)
            self._wake_all(self._flush_waiters)

    async def _write_some(
        self, pending: _Pending[E], write: Callable[[list[E]], Awaitable[int]]
    ) -> None:
        batch = pending.items[: self._max_batch]
        del pending.items[: self._max_batch]
        try:
            self.written += await write(batch)
        except Exception as exc:  # noqa: BLE001 - the writer outlives any batch
            self._lost(f"{len(batch)} {pending.what}", exc)
        finally:
            pending.done += len(batch)

    @staticmethod
    def _lost(what: str, exc: Exception) -> None:
        if isinstance(exc, StoreError):
            logger.error("lost %s: %s", what, exc)
        else:
            logger.error("lost %s", what, exc_info=exc)

    def _drop(self) -> None:
        if not self.dropped:
            logger.error("the audit writer has stopped: audit events are being lost")
        self.dropped += 1

    def _writer_stopped(self, task: asyncio.Task[None]) -> None:
        # Whatever ended it, nobody may wait for it any more.
        self._stopped = True
        if not task.cancelled() and task.exception() is not None:
            logger.error("the audit writer failed", exc_info=task.exception())
        self._wake_all(self._room_waiters)
        self._wake_all(self._flush_waiters)

    @staticmethod
    def _wake_all(waiters: list[asyncio.Future[None]]) -> None:
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        waiters.clear()
