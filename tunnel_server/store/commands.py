"""Commands in the store: records, states, and the interface the store implements.

A command's life (docs/architecture.md, "Commands")::

    pending --offer accepted--> delivered --agent starts--> running
       ^                            |                          |
       +----- lease lapsed, attempts left (attempt+1) ---------+
                                    |                          |
          lease lapsed, no attempts left -> lost     result -> succeeded | failed
                                                               | cancelled | timed_out

``attempt`` counts deliveries; a report from any other attempt is stale.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

__all__ = [
    "ACTIVE_STATES",
    "MAX_LIST",
    "PRUNE_BATCH",
    "TERMINAL_STATES",
    "CommandLogLine",
    "CommandRecord",
    "CommandState",
    "CommandStore",
    "LapsedLease",
    "NewCommand",
]

CommandState = Literal[
    "pending", "delivered", "running", "succeeded", "failed", "cancelled", "timed_out", "lost"
]
#: States in which an agent holds the command under a lease.
ACTIVE_STATES: frozenset[str] = frozenset({"delivered", "running"})
TERMINAL_STATES: frozenset[str] = frozenset(
    {"succeeded", "failed", "cancelled", "timed_out", "lost"}
)
#: Rows a pruning deletes in one transaction, so that other writes take turns.
PRUNE_BATCH = 1000
#: The most commands one listing returns.
MAX_LIST = 1000


@dataclass(frozen=True, slots=True)
class NewCommand:
    """What a submission stores."""

    id: str
    cluster: str
    submitter: str
    type: str
    name: str
    spec: dict[str, Any]
    max_attempts: int
    timeout_seconds: float
    idempotency_key: str | None = None


@dataclass(frozen=True, slots=True)
class CommandRecord:
    id: str
    cluster: str
    submitter: str
    type: str
    name: str
    spec: dict[str, Any]
    state: CommandState
    attempt: int
    max_attempts: int
    timeout_seconds: float
    created_at: datetime
    updated_at: datetime
    idempotency_key: str | None = None
    delivered_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    lease_expires_at: datetime | None = None
    cancel_requested: bool = False
    result: dict[str, Any] | None = None
    error: str | None = None
    log_bytes: int = 0
    log_truncated: bool = False

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES


@dataclass(frozen=True, slots=True)
class CommandLogLine:
    seq: int
    attempt: int
    time: datetime
    text: str


@dataclass(frozen=True, slots=True)
class LapsedLease:
    """A command whose lease lapsed, and what became of it."""

    command: CommandRecord
    requeued: bool = field(default=False)


class CommandStore(abc.ABC):
    """The part of the store that keeps commands (implemented by every Store)."""

    @abc.abstractmethod
    async def add_command(
        self, command: NewCommand, now: datetime, max_pending: int | None = None
    ) -> tuple[CommandRecord, bool]:
        """Store a command as pending; return it and True.

        With an idempotency key already used on the same cluster, return the
        existing command and False instead. With ``max_pending``, refuse a new
        command (QueueFullError) while its cluster has that many pending already.
        """

    @abc.abstractmethod
    async def get_command(self, command_id: str) -> CommandRecord:
        """The command with this id (NotFoundError otherwise)."""

    @abc.abstractmethod
    async def list_commands(
        self,
        cluster: str | None = None,
        state: str | None = None,
        limit: int = 100,
        submitter: str | None = None,
    ) -> list[CommandRecord]:
        """Commands, newest first, at most ``limit`` (capped at 1000), filtered by each
        argument given; their ``spec`` is left empty (read one command for it)."""

    @abc.abstractmethod
    async def pending_commands(self, cluster: str, limit: int = 100) -> list[CommandRecord]:
        """The cluster's pending commands, oldest first."""

    @abc.abstractmethod
    async def mark_delivered(
        self, command_id: str, attempt: int, now: datetime, lease_until: datetime
    ) -> CommandRecord | None:
        """The agent accepted ``attempt`` (the current attempt + 1) of a pending command.

        Returns the updated command, or None if it is no longer pending.
        """

    @abc.abstractmethod
    async def mark_running(
        self, command_id: str, attempt: int, now: datetime, lease_until: datetime
    ) -> CommandRecord | None:
        """The agent started (or, after a reconnect, still runs) ``attempt``.

        Returns None when that attempt is stale or the command has finished.
        """

    @abc.abstractmethod
    async def extend_lease(self, command_id: str, attempt: int, lease_until: datetime) -> bool:
        """Keep the lease of a delivered or running attempt; False if stale."""

    @abc.abstractmethod
    async def finish_command(
        self,
        command_id: str,
        attempt: int,
        state: CommandState,
        result: dict[str, Any] | None,
        error: str | None,
        now: datetime,
    ) -> CommandRecord | None:
        """Record the outcome of ``attempt``; None if it is stale or already finished."""

    @abc.abstractmethod
    async def withdraw_pending(
        self, command_id: str, reason: str, now: datetime
    ) -> CommandRecord | None:
        """Cancel a command still pending, saying why; None if it is no longer pending."""

    @abc.abstractmethod
    async def request_cancel(self, command_id: str, now: datetime) -> CommandRecord:
        """Ask for cancellation: a pending command is cancelled at once."""

    @abc.abstractmethod
    async def lapsed_lease_clusters(self, now: datetime) -> list[str]:
        """The clusters with a delivered or running command whose lease ran out before ``now``."""

    @abc.abstractmethod
    async def lapse_leases(
        self, now: datetime, heard: Mapping[str, datetime], absent_before: datetime | None
    ) -> list[LapsedLease]:
        """Judge the leases that ran out before ``now``: requeued while attempts remain, else lost.

        Only the leases of the clusters in ``heard`` that ran out before their
        agent was last heard from are judged, and those that ran out before
        ``absent_before`` (when given), whatever their cluster.
        """

    @abc.abstractmethod
    async def append_command_log(
        self, command_id: str, attempt: int, lines: Sequence[str], now: datetime, cap: int
    ) -> int:
        """Append log lines, keeping at most ``cap`` bytes per command; return lines kept."""

    @abc.abstractmethod
    async def count_commands(self, since: datetime) -> dict[str, int]:
        """How many commands are in each state, of those updated since ``since``
        (and every active one, however old)."""

    @abc.abstractmethod
    async def delete_finished_command_logs(self, before: datetime, limit: int = PRUNE_BATCH) -> int:
        """Delete at most ``limit`` log lines of commands that finished before ``before``.

        Returns how many it deleted: fewer than ``limit`` means none is left.
        A command's log can hold tens of thousands of lines: they go in batches
        of their own before :meth:`delete_finished_commands`.
        """

    @abc.abstractmethod
    async def delete_finished_commands(self, before: datetime, limit: int = PRUNE_BATCH) -> int:
        """Delete at most ``limit`` commands that finished before ``before``, with what is left
        of their logs.

        Oldest first; a command that has not finished is never deleted.
        Returns how many it deleted: fewer than ``limit`` means none is left.
        """

    @abc.abstractmethod
    async def command_log(
        self, command_id: str, after: int = 0, limit: int = 1000
    ) -> list[CommandLogLine]:
        """Log lines with ``seq > after``, oldest first."""
