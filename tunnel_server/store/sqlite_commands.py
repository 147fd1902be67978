"""The command queue's operations on SQLite (see ``commands`` for the states)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
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
from tunnel_server.store.sqlite_codec import decode_time, encode_time
from tunnel_server.store.sqlite_schema import transaction

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


def _time(value: str | None) -> datetime | None:
    return None if value is None else decode_time(value)


def _as_stored(spec: dict[str, Any]) -> Any:
    """``spec`` as it reads back from the store (JSON's types)."""
    return json.loads(json.dumps(spec))


#: Every column but ``spec``, which a listing replaces with an empty object.
_LISTED = (
    "id, cluster, submitter, type, name, '{}' AS spec, state, attempt, max_attempts,"
    " timeout_seconds, idempotency_key, created_at, updated_at, delivered_at, started_at,"
    " finished_at, lease_expires_at, cancel_requested, result, error, log_bytes, log_truncated"
)


def _record(row: sqlite3.Row) -> CommandRecord:
    return CommandRecord(
        id=row["id"],
        cluster=row["cluster"],
        submitter=row["submitter"],
        type=row["type"],
        name=row["name"],
        spec=json.loads(row["spec"]),
        state=row["state"],
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        timeout_seconds=row["timeout_seconds"],
        created_at=decode_time(row["created_at"]),
        updated_at=decode_time(row["updated_at"]),
        idempotency_key=row["idempotency_key"],
        delivered_at=_time(row["delivered_at"]),
        started_at=_time(row["started_at"]),
        finished_at=_time(row["finished_at"]),
        lease_expires_at=_time(row["lease_expires_at"]),
        cancel_requested=bool(row["cancel_requested"]),
        result=None if row["result"] is None else json.loads(row["result"]),
        error=row["error"],
        log_bytes=row["log_bytes"],
        log_truncated=bool(row["log_truncated"]),
    )


def _row(db: sqlite3.Connection, command_id: str) -> sqlite3.Row:
    row: sqlite3.Row | None = db.execute(
        "SELECT * FROM commands WHERE id = ?", (command_id,)
    ).fetchone()
    if row is None:
        raise NotFoundError(f"no command {command_id!r}")
    return row


def add_command(
    db: sqlite3.Connection, command: NewCommand, now: datetime, max_pending: int | None = None
) -> tuple[CommandRecord, bool]:
    if not 1 <= command.max_attempts <= 100:
        raise InvalidValueError("max_attempts must be 1..100")
    if max_pending is not None and max_pending < 1:
        raise InvalidValueError("max_pending must be at least 1")
    with transaction(db):
        if command.idempotency_key is not None:
            # Each submitter has keys of their own: another's cannot block or reveal them.
            existing = db.execute(
                "SELECT * FROM commands"
                " WHERE cluster = ? AND submitter = ? AND idempotency_key = ?",
                (command.cluster, command.submitter, command.idempotency_key),
            ).fetchone()
            if existing is not None:
                record = _record(existing)
                asked = (command.type, command.name, _as_stored(command.spec))
                if (record.type, record.name, record.spec) != asked:
                    # A different command does not answer a retry.
                    raise AlreadyExistsError(
                        f"idempotency key {command.idempotency_key!r} was used on cluster "
                        f"{command.cluster} for another command: a retry sends the same "
                        "command with its key, a new command a new key"
                    )
                return record, False
        if max_pending is not None:
            _check_room(db, command.cluster, max_pending)
        stamp = encode_time(now)
        row = db.execute(
            "INSERT INTO commands (id, cluster, submitter, type, name, spec, state, attempt,"
            " max_attempts, timeout_seconds, idempotency_key, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?, 'pending', 0, ?, ?, ?, ?, ?) RETURNING *",
            (
                command.id,
                command.cluster,
                command.submitter,
                command.type,
                command.name,
                json.dumps(command.spec),
                command.max_attempts,
                command.timeout_seconds,
                command.idempotency_key,
                stamp,
                stamp,
            ),
        ).fetchone()
        return _record(row), True


def _check_room(db: sqlite3.Connection, cluster: str, max_pending: int) -> None:
    """Raise QueueFullError if ``cluster`` has ``max_pending`` commands pending."""
    # Counting stops at the bound, so a long queue costs no more than a full one.
    (pending,) = db.execute(
        "SELECT COUNT(*) FROM (SELECT 1 FROM commands WHERE cluster = ? AND state = 'pending'"
        " LIMIT ?)",
        (cluster, max_pending),
    ).fetchone()
    if pending >= max_pending:
        raise QueueFullError(
            f"cluster {cluster!r} already has {max_pending} commands waiting for delivery"
            " (its agent is away or slower than the submissions); retry later, or raise"
            " the server's --max-pending-commands"
        )


def get_command(db: sqlite3.Connection, command_id: str) -> CommandRecord:
    return _record(_row(db, command_id))


def list_commands(
    db: sqlite3.Connection,
    cluster: str | None,
    state: str | None,
    limit: int,
    submitter: str | None = None,
) -> list[CommandRecord]:
    """Newest first; each record's ``spec`` is left empty (up to 1 MiB each, not listed)."""
    clauses, values = [], []
    for column, value in (("cluster", cluster), ("state", state), ("submitter", submitter)):
        if value is not None:
            clauses.append(f"{column} = ?")
            values.append(value)
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    rows = db.execute(
        f"SELECT {_LISTED} FROM commands {where} ORDER BY created_at DESC, id LIMIT ?",  # noqa: S608 - fixed clauses
        (*values, max(1, min(limit, MAX_LIST))),
    ).fetchall()
    return [_record(row) for row in rows]


def pending_commands(db: sqlite3.Connection, cluster: str, limit: int) -> list[CommandRecord]:
    rows = db.execute(
        "SELECT * FROM commands WHERE cluster = ? AND state = 'pending'"
        " ORDER BY created_at, id LIMIT ?",
        (cluster, max(1, min(limit, MAX_LIST))),
    ).fetchall()
    return [_record(row) for row in rows]


def mark_delivered(
    db: sqlite3.Connection, command_id: str, attempt: int, now: datetime, lease_until: datetime
) -> CommandRecord | None:
    stamp = encode_time(now)
    row = db.execute(
        "UPDATE commands SET state = 'delivered', attempt = ?, delivered_at = ?,"
        " lease_expires_at = ?, updated_at = ?"
        " WHERE id = ? AND state = 'pending' AND attempt = ? RETURNING *",
        (attempt, stamp, encode_time(lease_until), stamp, command_id, attempt - 1),
    ).fetchone()
    return None if row is None else _record(row)


def mark_running(
    db: sqlite3.Connection, command_id: str, attempt: int, now: datetime, lease_until: datetime
) -> CommandRecord | None:
    stamp = encode_time(now)
    row = db.execute(
        "UPDATE commands SET state = 'running', started_at = COALESCE(started_at, ?),"
        " lease_expires_at = ?, updated_at = ?"
        " WHERE id = ? AND attempt = ? AND state IN ('delivered', 'running') RETURNING *",
        (stamp, encode_time(lease_until), stamp, command_id, attempt),
    ).fetchone()
    return None if row is None else _record(row)


def extend_lease(
    db: sqlite3.Connection, command_id: str, attempt: int, lease_until: datetime
) -> bool:
    cursor = db.execute(
        "UPDATE commands SET lease_expires_at = ?"
        " WHERE id = ? AND attempt = ? AND state IN ('delivered', 'running')",
        (encode_time(lease_until), command_id, attempt),
    )
    return cursor.rowcount > 0


def finish_command(
    db: sqlite3.Connection,
    command_id: str,
    attempt: int,
    state: CommandState,
    result: dict[str, Any] | None,
    error: str | None,
    now: datetime,
) -> CommandRecord | None:
    if state not in TERMINAL_STATES:
        raise InvalidValueError(f"{state!r} is not a final state")
    stamp = encode_time(now)
    row = db.execute(
        "UPDATE commands SET state = ?, result = ?, error = ?, finished_at = ?,"
        " lease_expires_at = NULL, updated_at = ?"
        " WHERE id = ? AND attempt = ? AND state IN ('delivered', 'running') RETURNING *",
        (
            state,
            None if result is None else json.dumps(result),
            error,
            stamp,
            stamp,
            command_id,
            attempt,
        ),
    ).fetchone()
    return None if row is None else _record(row)


def withdraw_pending(
    db: sqlite3.Connection, command_id: str, reason: str, now: datetime
) -> CommandRecord | None:
    """See :meth:`CommandStore.withdraw_pending`."""
    stamp = encode_time(now)
    row = db.execute(
        "UPDATE commands SET state = 'cancelled', error = ?, finished_at = ?, updated_at = ?"
        " WHERE id = ? AND state = 'pending' RETURNING *",
        (reason, stamp, stamp, command_id),
    ).fetchone()
    return None if row is None else _record(row)


def request_cancel(db: sqlite3.Connection, command_id: str, now: datetime) -> CommandRecord:
    stamp = encode_time(now)
    with transaction(db):
        record = _record(_row(db, command_id))
        if record.state == "pending":
            db.execute(
                "UPDATE commands SET state = 'cancelled', cancel_requested = 1,"
                " error = 'cancelled before delivery', finished_at = ?, updated_at = ?"
                " WHERE id = ?",
                (stamp, stamp, command_id),
            )
        elif record.state in ACTIVE_STATES:
            db.execute(
                "UPDATE commands SET cancel_requested = 1, updated_at = ? WHERE id = ?",
                (stamp, command_id),
            )
        return _record(_row(db, command_id))


#: A delivered or running command whose lease ran out before a time (its one parameter).
_LEASE_RAN_OUT = "state IN ('delivered', 'running') AND lease_expires_at < ?"


def lapsed_lease_clusters(db: sqlite3.Connection, now: datetime) -> list[str]:
    rows = db.execute(
        f"SELECT DISTINCT cluster FROM commands WHERE {_LEASE_RAN_OUT}",  # noqa: S608 - fixed clauses
        (encode_time(now),),
    ).fetchall()
    return [row[0] for row in rows]


def lapse_leases(
    db: sqlite3.Connection,
    now: datetime,
    heard: dict[str, datetime],
    absent_before: datetime | None,
) -> list[LapsedLease]:
    stamp = encode_time(now)
    # No lease runs out before the earliest time there is: absent_before None judges none so.
    absent = encode_time(absent_before) if absent_before is not None else ""
    heard_at = json.dumps({cluster: encode_time(at) for cluster, at in heard.items()})
    lapsed: list[LapsedLease] = []
    with transaction(db):
        rows = db.execute(
            f"SELECT * FROM commands WHERE {_LEASE_RAN_OUT}"  # noqa: S608 - fixed clauses
            " AND (lease_expires_at < ? OR EXISTS (SELECT 1 FROM json_each(?) AS heard"
            " WHERE heard.key = commands.cluster AND commands.lease_expires_at < heard.value))",
            (stamp, absent, heard_at),
        ).fetchall()
        for row in rows:
            record = _record(row)
            if record.cancel_requested:
                db.execute(
                    "UPDATE commands SET state = 'cancelled', lease_expires_at = NULL,"
                    " error = 'cancelled; the agent was lost', finished_at = ?, updated_at = ?"
                    " WHERE id = ?",
                    (stamp, stamp, record.id),
                )
                requeued = False
            elif record.attempt < record.max_attempts:
                db.execute(
                    "UPDATE commands SET state = 'pending', lease_expires_at = NULL,"
                    " updated_at = ? WHERE id = ?",
                    (stamp, record.id),
                )
                requeued = True
            else:
                db.execute(
                    "UPDATE commands SET state = 'lost', lease_expires_at = NULL,"
                    " error = ?, finished_at = ?, updated_at = ? WHERE id = ?",
                    (
                        f"the agent was lost during attempt {record.attempt} of "
                        f"{record.max_attempts}",
                        stamp,
                        stamp,
                        record.id,
                    ),
                )
                requeued = False
            lapsed.append(LapsedLease(_record(_row(db, record.id)), requeued))
    return lapsed


def append_command_log(
    db: sqlite3.Connection,
    command_id: str,
    attempt: int,
    lines: Sequence[str],
    now: datetime,
    cap: int,
) -> int:
    stamp = encode_time(now)
    kept = 0
    with transaction(db):
        row = db.execute(
            "SELECT log_bytes, log_truncated FROM commands WHERE id = ?", (command_id,)
        ).fetchone()
        if row is None:
            raise NotFoundError(f"no command {command_id!r}")
        used, truncated = row["log_bytes"], bool(row["log_truncated"])
        if truncated:
            return 0
        for line in lines:
            # The line and its end: empty lines are rows too, and count.
            size = len(line.encode()) + 1
            if used + size > cap:
                db.execute(
                    "INSERT INTO command_logs (command_id, attempt, time, text)"
                    " VALUES (?, ?, ?, ?)",
                    (command_id, attempt, stamp, _TRUNCATED),
                )
                truncated = True
                break
            db.execute(
                "INSERT INTO command_logs (command_id, attempt, time, text) VALUES (?, ?, ?, ?)",
                (command_id, attempt, stamp, line),
            )
            used += size
            kept += 1
        db.execute(
            "UPDATE commands SET log_bytes = ?, log_truncated = ? WHERE id = ?",
            (used, int(truncated), command_id),
        )
    return kept


def count_commands(db: sqlite3.Connection, since: datetime) -> dict[str, int]:
    rows = db.execute(
        "SELECT state, COUNT(*) AS n FROM commands"
        " WHERE updated_at >= ? OR state IN ('pending', 'delivered', 'running')"
        " GROUP BY state",
        (encode_time(since),),
    ).fetchall()
    return {row["state"]: row["n"] for row in rows}


def command_log(
    db: sqlite3.Connection, command_id: str, after: int, limit: int
) -> list[CommandLogLine]:
    rows = db.execute(
        "SELECT seq, attempt, time, text FROM command_logs WHERE command_id = ? AND seq > ?"
        " ORDER BY seq LIMIT ?",
        (command_id, after, max(1, min(limit, 10_000))),
    ).fetchall()
    return [
        CommandLogLine(row["seq"], row["attempt"], decode_time(row["time"]), row["text"])
        for row in rows
    ]


#: Commands finished before a time (its one parameter): what retention deletes.
_FINISHED_BEFORE = (
    "SELECT id FROM commands WHERE finished_at < ?"
    " AND state NOT IN ('pending', 'delivered', 'running')"
)


def delete_finished_command_logs(db: sqlite3.Connection, before: datetime, limit: int) -> int:
    """See :meth:`CommandStore.delete_finished_command_logs` (one statement: atomic alone)."""
    return db.execute(
        "DELETE FROM command_logs WHERE seq IN (SELECT seq FROM command_logs"  # noqa: S608 - fixed clauses
        f" WHERE command_id IN ({_FINISHED_BEFORE}) LIMIT ?)",
        (encode_time(before), limit),
    ).rowcount


def delete_finished_commands(db: sqlite3.Connection, before: datetime, limit: int) -> int:
    """See :meth:`CommandStore.delete_finished_commands` (logs left go by ``ON DELETE CASCADE``)."""
    return db.execute(
        f"DELETE FROM commands WHERE id IN ({_FINISHED_BEFORE} ORDER BY finished_at LIMIT ?)",  # noqa: S608 - fixed clauses
        (encode_time(before), limit),
    ).rowcount
