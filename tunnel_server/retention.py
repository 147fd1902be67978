"""What the server forgets: audit events and finished commands past their retention.

The store grows with use: every proxied request leaves an audit event, every
command its record and up to 1 MiB of log. A :class:`Pruner`
deletes, once at start and then hourly, the audit events older than
``--audit-retention`` and the commands that finished before
``--command-retention`` (with their logs). A command still pending, delivered
or running is never deleted, however old.

Deletion goes in batches of :data:`~tunnel_server.store.commands.PRUNE_BATCH`
rows (a command's log lines first, then the commands), one transaction each,
so that a first pruning after a long time (or a shortened retention) does not
hold the database thread for seconds while agents, callers and the audit wait
for it. SQLite keeps the freed pages and
reuses them: the file stops growing, it does not shrink.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from tunnel_server.clock import utcnow
from tunnel_server.store.base import Store, StoreError
from tunnel_server.store.commands import PRUNE_BATCH

__all__ = ["MIN_RETENTION", "Pruned", "Pruner"]

logger = logging.getLogger(__name__)

#: The shortest retention the server accepts: anything less is a typo, not a policy.
MIN_RETENTION = timedelta(hours=1)
#: How often the pruner runs.
PRUNE_INTERVAL = 3600.0


@dataclass(frozen=True, slots=True)
class Pruned:
    """What one pruning deleted."""

    audit_events: int
    commands: int
    command_log_lines: int


class Pruner:
    """Deletes what is past its retention, at start and every ``interval`` seconds."""

    def __init__(
        self,
        store: Store,
        *,
        audit_retention: timedelta,
        command_retention: timedelta,
        interval: float = PRUNE_INTERVAL,
        batch: int = PRUNE_BATCH,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        for name, retention in (("audit", audit_retention), ("command", command_retention)):
            if retention < MIN_RETENTION:
                raise ValueError(f"the {name} retention must be at least {MIN_RETENTION}")
        if batch < 1:
            raise ValueError("batch must be at least 1")
        self._store = store
        self._audit_retention = audit_retention
        self._command_retention = command_retention
        self._interval = interval
        self._batch = batch
        self._clock = clock

    async def prune(self) -> Pruned:
        """Delete, now, everything past its retention; say how much."""
        now = self._clock()
        audit = await self._in_batches(self._store.delete_audit_before, now - self._audit_retention)
        cutoff = now - self._command_retention
        # Logs first, in batches of lines: a command may have tens of thousands.
        lines = await self._in_batches(self._store.delete_finished_command_logs, cutoff)
        commands = await self._in_batches(self._store.delete_finished_commands, cutoff)
        return Pruned(audit_events=audit, commands=commands, command_log_lines=lines)

    async def _in_batches(
        self, delete: Callable[[datetime, int], Awaitable[int]], before: datetime
    ) -> int:
        total = 0
        while True:
            deleted = await delete(before, self._batch)
            total += deleted
            if deleted < self._batch:
                return total

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Prune while the block runs; the pruning in progress is cancelled at its end."""
        task = asyncio.create_task(self._prune_forever(), name="pruner")
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _prune_forever(self) -> None:
        while True:
            try:
                pruned = await self.prune()
            except StoreError as exc:
                logger.error("cannot prune the store: %s (trying again at the next pruning)", exc)
            except Exception:
                logger.exception("pruning failed (trying again at the next pruning)")
            else:
                if pruned.audit_events or pruned.commands or pruned.command_log_lines:
                    logger.info(
                        "pruned %d audit events, and %d finished commands with %d log lines,"
                        " past their retention",
                        pruned.audit_events,
                        pruned.commands,
                        pruned.command_log_lines,
                    )
            await asyncio.sleep(self._interval)
