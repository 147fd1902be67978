"""The command queue's operations on PostgreSQL (see ``commands`` for the states).

Several replicas may offer, run and judge one cluster's commands at once, so
every change of state is one conditional ``UPDATE`` that names the state and
attempt it expects: of two replicas that try to deliver one pending command,
the database lets the first change it and the second find it no longer
pending (PostgreSQL re-checks the condition on the row the first committed).
Judging lapsed leases and pruning lock the rows they take with ``FOR UPDATE
SKIP LOCKED``, so two reapers never judge one lease twice. Nothing here
relies on a lock in the process.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from tunnel_server.store.base import (
    AlreadyExistsError,
    InvalidValueError,
    NotFoundError,
    QueueFullError,
)
from tunnel_server.store.commands import (
    ACTIVE_STATES,
    MAX_LIST,
    TERMINAL_STATES,
    CommandLogLine,
    CommandRecord,
    CommandState,
    LapsedLease,
    NewCommand,
)
from tunnel_server.store.postgres_codec import command_from_row, encode_json, utc
from tunnel_server.store.postgres_schema import Connection

__all__ = [
    "add_command",
    "append_command_log",
    "command_log",
    "count_commands",
    "delete_finished_command_logs",
    "delete_finished_commands",
    "extend_lease",
    "finish_command",
    "get_command",
    "lapse_leases",
    "lapsed_lease_clusters",
    "list_commands",
    "mark_delivered",
    "mark_running",
    "pending_commands",
    "request_cancel",
    "withdraw_pending",
]

_TRUNCATED = "[log truncated: the command wrote more than the server keeps]"

#: Every column but ``spec``, which a listing replaces with an empty object.
_LISTED = (
    "id, cluster, submitter, type, name, '{}'::jsonb AS spec, state, attempt, max_attempts,"
    " timeout_seconds, idempotency_key, created_at, updated_at, delivered_at, started_at,"
    " finished_at, lease_expires_at, cancel_requested, result, error, log_bytes, log_truncated"
)


def _count(status: str) -> int:
    return int(status.rsplit(" ", 1)[-1])


def _optional(row: Any) -> CommandRecord | None:
    return None if row is None else command_from_row(row)


async def _get(db: Connection, command_id: str, lock: str = "") -> CommandRecord:
    row = await db.fetchrow(f"SELECT * FROM commands WHERE id = $1 {lock}", command_id)  # noqa: S608 - constant lock clause
    if row is None:
        raise NotFoundError(f"no command {command_id!r}")
    return command_from_row(row)


async def add_command(
    db: Connection, command: NewCommand, now: datetime, max_pending: int | None = None
) -> tuple[CommandRecord, bool]:
    """See :meth:`CommandStore.add_command`."""
    if not 1 <= command.max_attempts <= 100:
        raise InvalidValueError("max_attempts must be 1..100")
    if max_pending is not None and max_pending < 1:
        raise InvalidValueError("max_pending must be at least 1")
    stamp = utc(now)
    spec = encode_json(command.spec)
    async with db.transaction():
        existing = await _same_key(db, command)
        if existing is not None:
            return existing, False
        if max_pending is not None:
            await _check_room(db, command.cluster, max_pending)
        row = await db.fetchrow(
            "INSERT INTO commands (id, cluster, submitter, type, name, spec, state, attempt,"
            " max_attempts, timeout_seconds, idempotency_key, created_at, updated_at)"
            " VALUES ($1, $2, $3, $4, $5, $6::jsonb, 'pending', 0, $7, $8, $9, $10, $10)"
            " ON CONFLICT (cluster, submitter, idempotency_key)"
            " WHERE idempotency_key IS NOT NULL DO NOTHING RETURNING *",
            command.id,
            command.cluster,
            command.submitter,
            command.type,
            command.name,
            spec,
            command.max_attempts,
            command.timeout_seconds,
            command.idempotency_key,
            stamp,
        )
        if row is not None:
            return command_from_row(row), True
        # Another replica stored a command with this key meanwhile: it answers this one.
        existing = await _same_key(db, command)
        if existing is None:  # pragma: no cover - the conflict's row is committed
            raise AlreadyExistsError("a command with this idempotency key exists already")
        return existing, False


async def _same_key(db: Connection, command: NewCommand) -> CommandRecord | None:
    """The command stored under ``command``'s idempotency key, if it is the same command."""
    if command.idempotency_key is None:
        return None
    # Each submitter has keys of their own: another's cannot block or reveal them.
    row = await db.fetchrow(
        "SELECT * FROM commands WHERE cluster = $1 AND submitter = $2 AND idempotency_key = $3",
        command.cluster,
        command.submitter,
        command.idempotency_key,
    )
    if row is None:
        return None
    record = command_from_row(row)
    asked = (command.type, command.name, json.loads(json.dumps(command.spec)))
    if (record.type, record.name, record.spec) != asked:
        # A different command does not answer a retry.
        raise AlreadyExistsError(
            f"idempotency key {command.idempotency_key!r} was used on cluster "
            f"{command.cluster} for another command: a retry sends the same "
            "command with its key, a new command a new key"
        )
    return record


async def _check_room(db: Connection, cluster: str, max_pending: int) -> None:
    """Raise QueueFullError if ``cluster`` has ``max_pending`` commands pending."""
    # Submissions to one cluster take turns until they commit (a lock the database
    # holds for the transaction), so that replicas cannot overfill the queue together.
    await db.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", f"queue:{cluster}")
    # Counting stops at the bound, so a long queue costs no more than a full one.
    pending = await db.fetchval(
        "SELECT count(*) FROM (SELECT 1 FROM commands WHERE cluster = $1 AND state = 'pending'"
        " LIMIT $2) AS waiting",
        cluster,
        max_pending,
    )
    if pending >= max_pending:
        raise QueueFullError(
            f"cluster {cluster!r} already has {max_pending} commands waiting for delivery"
            " (its agent is away or slower than the submissions); retry later, or raise"
            " the server's --max-pending-commands"
        )


async def get_command(db: Connection, command_id: str) -> CommandRecord:
    """See :meth:`CommandStore.get_command`."""
    return await _get(db, command_id)


async def list_commands(
    db: Connection,
    cluster: str | None,
    state: str | None,
    limit: int,
    submitter: str | None = None,
) -> list[CommandRecord]:
    """Newest first; each record's ``spec`` is left empty (up to 1 MiB each, not listed)."""
    clauses: list[str] = []
    values: list[object] = []
    for column, value in (("cluster", cluster), ("state", state), ("submitter", submitter)):
        if value is not None:
            values.append(value)
            clauses.append(f"{column} = ${len(values)}")
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    values.append(max(1, min(limit, MAX_LIST)))
    rows = await db.fetch(
        f"SELECT {_LISTED} FROM commands {where} ORDER BY created_at DESC, id"  # noqa: S608 - fixed clauses
        f" LIMIT ${len(values)}",
        *values,
    )
    return [command_from_row(row) for row in rows]


async def pending_commands(db: Connection, cluster: str, limit: int) -> list[CommandRecord]:
    """See :meth:`CommandStore.pending_commands`."""
    rows = await db.fetch(
        "SELECT * FROM commands WHERE cluster = $1 AND state = 'pending'"
        " ORDER BY created_at, id LIMIT $2",
        cluster,
        max(1, min(limit, MAX_LIST)),
    )
    return [command_from_row(row) for row in rows]


async def mark_delivered(
    db: Connection, command_id: str, attempt: int, now: datetime, lease_until: datetime
) -> CommandRecord | None:
    """See :meth:`CommandStore.mark_delivered`: one replica wins, the others get None."""
    row = await db.fetchrow(
        "UPDATE commands SET state = 'delivered', attempt = $2, delivered_at = $3,"
        " lease_expires_at = $4, updated_at = $3"
        " WHERE id = $1 AND state = 'pending' AND attempt = $2 - 1 RETURNING *",
        command_id,
        attempt,
        utc(now),
        utc(lease_until),
    )
    return _optional(row)


async def mark_running(
    db: Connection, command_id: str, attempt: int, now: datetime, lease_until: datetime
) -> CommandRecord | None:
    """See :meth:`CommandStore.mark_running`."""
    row = await db.fetchrow(
        "UPDATE commands SET state = 'running', started_at = COALESCE(started_at, $3),"
        " lease_expires_at = $4, updated_at = $3"
        " WHERE id = $1 AND attempt = $2 AND state IN ('delivered', 'running') RETURNING *",
        command_id,
        attempt,
        utc(now),
        utc(lease_until),
    )
    return _optional(row)


async def extend_lease(
    db: Connection, command_id: str, attempt: int, lease_until: datetime
) -> bool:
    """See :meth:`CommandStore.extend_lease`."""
    status = await db.execute(
        "UPDATE commands SET lease_expires_at = $3"
        " WHERE id = $1 AND attempt = $2 AND state IN ('delivered', 'running')",
        command_id,
        attempt,
        utc(lease_until),
    )
    return _count(status) > 0


async def finish_command(
    db: Connection,
    command_id: str,
    attempt: int,
    state: CommandState,
    result: dict[str, Any] | None,
    error: str | None,
    now: datetime,
) -> CommandRecord | None:
    """See :meth:`CommandStore.finish_command`."""
    if state not in TERMINAL_STATES:
        raise InvalidValueError(f"{state!r} is not a final state")
    row = await db.fetchrow(
        "UPDATE commands SET state = $3, result = $4::jsonb, error = $5, finished_at = $6,"
        " lease_expires_at = NULL, updated_at = $6"
        " WHERE id = $1 AND attempt = $2 AND state IN ('delivered', 'running') RETURNING *",
        command_id,
        attempt,
        state,
        None if result is None else encode_json(result),
        error,
        utc(now),
    )
    return _optional(row)


async def withdraw_pending(
    db: Connection, command_id: str, reason: str, now: datetime
) -> CommandRecord | None:
    """See :meth:`CommandStore.withdraw_pending`."""
    row = await db.fetchrow(
        "UPDATE commands SET state = 'cancelled', error = $2, finished_at = $3, updated_at = $3"
        " WHERE id = $1 AND state = 'pending' RETURNING *",
        command_id,
        reason,
        utc(now),
    )
    return _optional(row)


async def request_cancel(db: Connection, command_id: str, now: datetime) -> CommandRecord:
    """See :meth:`CommandStore.request_cancel`."""
    stamp = utc(now)
    async with db.transaction():
        record = await _get(db, command_id, "FOR UPDATE")
        if record.state == "pending":
            row = await db.fetchrow(
                "UPDATE commands SET state = 'cancelled', cancel_requested = true,"
                " error = 'cancelled before delivery', finished_at = $2, updated_at = $2"
                " WHERE id = $1 RETURNING *",
                command_id,
                stamp,
            )
        elif record.state in ACTIVE_STATES:
            row = await db.fetchrow(
                "UPDATE commands SET cancel_requested = true, updated_at = $2"
                " WHERE id = $1 RETURNING *",
                command_id,
                stamp,
            )
        else:
            return record
        return command_from_row(row) if row is not None else record


#: A delivered or running command whose lease ran out before a time (parameter 1).
_LEASE_RAN_OUT = "state IN ('delivered', 'running') AND lease_expires_at < $1"


async def lapsed_lease_clusters(db: Connection, now: datetime) -> list[str]:
    """See :meth:`CommandStore.lapsed_lease_clusters`."""
    rows = await db.fetch(
        f"SELECT DISTINCT cluster FROM commands WHERE {_LEASE_RAN_OUT} ORDER BY cluster",  # noqa: S608 - fixed clauses
        utc(now),
    )
    return [row["cluster"] for row in rows]


async def lapse_leases(
    db: Connection,
    now: datetime,
    heard: Mapping[str, datetime],
    absent_before: datetime | None,
) -> list[LapsedLease]:
    """See :meth:`CommandStore.lapse_leases`."""
    stamp = utc(now)
    clusters = list(heard)
    heard_at = [utc(heard[cluster]) for cluster in clusters]
    absent = None if absent_before is None else utc(absent_before)
    lapsed: list[LapsedLease] = []
    async with db.transaction():
        # A lease another replica is judging (or its agent extending) is locked: it is
        # left to that one now, and judged again on the next round if still lapsed.
        rows = await db.fetch(
            f"SELECT * FROM commands WHERE {_LEASE_RAN_OUT}"  # noqa: S608 - fixed clauses
            " AND (lease_expires_at < $2 OR EXISTS (SELECT 1 FROM"
            " unnest($3::text[], $4::timestamptz[]) AS heard (cluster, at)"
            " WHERE heard.cluster = commands.cluster AND commands.lease_expires_at < heard.at))"
            " ORDER BY lease_expires_at, id FOR UPDATE SKIP LOCKED",
            stamp,
            absent,
            clusters,
            heard_at,
        )
        for row in rows:
            record = command_from_row(row)
            if record.cancel_requested:
                updated = await db.fetchrow(
                    "UPDATE commands SET state = 'cancelled', lease_expires_at = NULL,"
                    " error = 'cancelled; the agent was lost', finished_at = $2, updated_at = $2"
                    " WHERE id = $1 RETURNING *",
                    record.id,
                    stamp,
                )
                requeued = False
            elif record.attempt < record.max_attempts:
                updated = await db.fetchrow(
                    "UPDATE commands SET state = 'pending', lease_expires_at = NULL,"
                    " updated_at = $2 WHERE id = $1 RETURNING *",
                    record.id,
                    stamp,
                )
                requeued = True
            else:
                updated = await db.fetchrow(
                    "UPDATE commands SET state = 'lost', lease_expires_at = NULL,"
                    " error = $3, finished_at = $2, updated_at = $2 WHERE id = $1 RETURNING *",
                    record.id,
                    stamp,
                    f"the agent was lost during attempt {record.attempt} of {record.max_attempts}",
                )
                requeued = False
            if updated is not None:
                lapsed.append(LapsedLease(command_from_row(updated), requeued))
    return lapsed


async def append_command_log(
    db: Connection,
    command_id: str,
    attempt: int,
    lines: Sequence[str],
    now: datetime,
    cap: int,
) -> int:
    """See :meth:`CommandStore.append_command_log`."""
    stamp = utc(now)
    async with db.transaction():
        # The row lock makes appends to one command take turns: the byte count stays
        # true, and line numbers grow in the order the lines are committed.
        row = await db.fetchrow(
            "SELECT log_bytes, log_truncated FROM commands WHERE id = $1 FOR UPDATE",
            command_id,
        )
        if row is None:
            raise NotFoundError(f"no command {command_id!r}")
        used, truncated = int(row["log_bytes"]), bool(row["log_truncated"])
        if truncated:
            return 0
        texts: list[str] = []
        for line in lines:
            # The line and its end: empty lines are rows too, and count.
            size = len(line.encode()) + 1
            if used + size > cap:
                texts.append(_TRUNCATED)
                truncated = True
                break
            texts.append(line)
            used += size
        kept = len(texts) - int(truncated)
        if texts:
            await db.execute(
                "INSERT INTO command_logs (command_id, attempt, time, text)"
                " SELECT $1, $2, $3, line.text FROM unnest($4::text[]) WITH ORDINALITY"
                " AS line (text, n) ORDER BY line.n",
                command_id,
                attempt,
                stamp,
                texts,
            )
        await db.execute(
            "UPDATE commands SET log_bytes = $2, log_truncated = $3 WHERE id = $1",
            command_id,
            used,
            truncated,
        )
    return kept


async def count_commands(db: Connection, since: datetime) -> dict[str, int]:
    """See :meth:`CommandStore.count_commands`."""
    rows = await db.fetch(
        "SELECT state, count(*) AS n FROM commands"
        " WHERE updated_at >= $1 OR state IN ('pending', 'delivered', 'running')"
        " GROUP BY state",
        utc(since),
    )
    return {row["state"]: int(row["n"]) for row in rows}


async def command_log(
    db: Connection, command_id: str, after: int, limit: int
) -> list[CommandLogLine]:
    """See :meth:`CommandStore.command_log`."""
    rows = await db.fetch(
        "SELECT seq, attempt, time, text FROM command_logs WHERE command_id = $1 AND seq > $2"
        " ORDER BY seq LIMIT $3",
        command_id,
        after,
        max(1, min(limit, 10_000)),
    )
    return [
        CommandLogLine(row["seq"], row["attempt"], utc(row["time"]), row["text"]) for row in rows
    ]


#: Commands finished before a time (parameter 1): what retention deletes.
_FINISHED_BEFORE = (
    "SELECT id FROM commands WHERE finished_at < $1"
    " AND state NOT IN ('pending', 'delivered', 'running')"
)


async def delete_finished_command_logs(db: Connection, before: datetime, limit: int) -> int:
    """See :meth:`CommandStore.delete_finished_command_logs` (one statement: atomic alone)."""
    status = await db.execute(
        "DELETE FROM command_logs WHERE seq IN (SELECT seq FROM command_logs"  # noqa: S608 - fixed clauses
        f" WHERE command_id IN ({_FINISHED_BEFORE}) LIMIT $2 FOR UPDATE SKIP LOCKED)",
        utc(before),
        limit,
    )
    return _count(status)


async def delete_finished_commands(db: Connection, before: datetime, limit: int) -> int:
    """See :meth:`CommandStore.delete_finished_commands` (logs left go by ``ON DELETE CASCADE``)."""
    status = await db.execute(
        f"DELETE FROM commands WHERE id IN ({_FINISHED_BEFORE}"  # noqa: S608 - fixed clauses
        " ORDER BY finished_at LIMIT $2 FOR UPDATE SKIP LOCKED)",
        utc(before),
        limit,
    )
    return _count(status)
