"""The audit trail's operations, as plain functions of a sqlite3 connection.

Like ``sqlite_ops``: ``SqliteStore`` runs each on its database thread. Every
proxied request and admin action writes one row, in batches (``AuditWriter``),
so the inserts are built to hold the interpreter as little as they can.
"""

from __future__ import annotations

import functools
import itertools
import sqlite3
from dataclasses import replace
from datetime import datetime

from tunnel_server.store.base import (
    MAX_AUDIT_LIMIT,
    AuditEvent,
    AuditKind,
    InvalidValueError,
    ProxyAuditRecord,
    StoreError,
)
from tunnel_server.store.sqlite_codec import (
    audit_from_row,
    check_kind,
    encode_detail,
    encode_time,
    optional_time,
    utc,
)
from tunnel_server.store.sqlite_schema import transaction

__all__ = [
    "add_audit",
    "add_audit_events",
    "add_proxy_audit",
    "delete_audit_before",
    "list_audit",
]

_INSERT_AUDIT = (
    "INSERT INTO audit (time, user_name, cluster, kind, verb, path, status,"
    " bytes_in, bytes_out, duration_ms, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def _audit_row(event: AuditEvent) -> tuple[object, ...]:
    return (
        encode_time(event.time),
        event.user,
        event.cluster,
        check_kind(event.kind),
        event.verb,
        event.path,
        event.status,
        event.bytes_in,
        event.bytes_out,
        event.duration_ms,
        encode_detail(event.detail),
    )


def add_audit(db: sqlite3.Connection, event: AuditEvent) -> AuditEvent:
    """See :meth:`Store.add_audit`."""
    cursor = db.execute(_INSERT_AUDIT, _audit_row(event))
    if cursor.lastrowid is None:  # an INSERT always sets it; this keeps the type honest
        raise StoreError("the state database assigned no id to an audit event")
    return replace(event, id=cursor.lastrowid, time=utc(event.time))


def add_audit_events(db: sqlite3.Connection, events: list[AuditEvent]) -> int:
    """See :meth:`Store.add_audit_events`: one transaction, one statement for the batch.

    The rows are built (and validated) first; ``executemany`` then inserts
    them in one C loop, so the database thread holds the interpreter for
    less of a busy proxy's time.
    """
    rows = [_audit_row(event) for event in events]
    with transaction(db):
        db.executemany(_INSERT_AUDIT, rows)
    return len(rows)


#: Rows of proxied requests' events per INSERT statement: powers of two, so
#: that a batch of any size runs a few statements SQLite has prepared before.
_PROXY_AUDIT_CHUNKS = (256, 64, 16, 4, 1)


# The time becomes encode_time's text in SQL: seconds by strftime, then the
# microseconds, always six digits, and the UTC offset; the detail is SQLite's
# JSON too: "ended" and "as" where they are not empty, else the constant '{}'.
_INSERT_PROXY_AUDIT = (
    "INSERT INTO audit (time, user_name, cluster, kind, verb, path, status,"
    " bytes_in, bytes_out, duration_ms, detail)"
    " SELECT strftime('%Y-%m-%dT%H:%M:%S', column1 / 1000000, 'unixepoch')"
    " || printf('.%06d+00:00', column1 % 1000000),"
    " column2, column3, 'proxy', column4, column5, column6, column7, column8, column9,"
    " CASE WHEN column11 = '' THEN"
    " CASE column10 WHEN '' THEN '{}' ELSE json_object('ended', column10) END"
    # The identity is JSON already (recorded_identity): joined as text, not parsed again.
    " WHEN column10 = '' THEN '{\"as\":' || column11 || '}'"
    " ELSE json_object('ended', column10, 'as', json(column11)) END"
    " FROM (VALUES "
)


@functools.cache
def _insert_proxy_audit(rows: int) -> str:
    """The statement that inserts ``rows`` records (placeholders only: values are bound)."""
    # The twelfth value, the replicas, is always empty here: SQLite serves one replica.
    return _INSERT_PROXY_AUDIT + ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"] * rows) + ")"


def add_proxy_audit(db: sqlite3.Connection, records: list[ProxyAuditRecord]) -> int:
    """See :meth:`Store.add_proxy_audit`: one transaction, a few statements per batch.

    Each statement inserts many rows and SQLite formats the times, so the
    database thread runs Python (and holds the interpreter, which the event
    loop needs) for a few bound parameters per row, instead of for a
    statement step and a time encoding per row.
    """
    for record in records:
        if record.time_us < 0:
            raise InvalidValueError("an audit time before 1970 cannot be stored")
    with transaction(db):
        start = 0
        for size in _PROXY_AUDIT_CHUNKS:
            while len(records) - start >= size:
                chunk = records[start : start + size]
                db.execute(_insert_proxy_audit(size), list(itertools.chain.from_iterable(chunk)))
                start += size
    return len(records)


def list_audit(
    db: sqlite3.Connection,
    cluster: str | None,
    user: str | None,
    kind: AuditKind | None,
    since: datetime | None,
    limit: int,
) -> list[AuditEvent]:
    """See :meth:`Store.list_audit`."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidValueError(f"the audit limit must be a positive integer, not {limit!r}")
    # Only the filters given enter the query, so that SQLite can use the matching index.
    clauses: list[str] = []
    params: list[object] = []
    for clause, value in (
        ("cluster = ?", cluster),
        ("user_name = ?", user),
        ("kind = ?", None if kind is None else check_kind(kind)),
        ("time >= ?", optional_time(since)),
    ):
        if value is not None:
            clauses.append(clause)
            params.append(value)
    where = f"WHERE {' AND '.join(clauses)} " if clauses else ""
    params.append(min(limit, MAX_AUDIT_LIMIT))
    rows = db.execute(
        f"SELECT * FROM audit {where}ORDER BY time DESC, id DESC LIMIT ?",  # noqa: S608 - constant fragments, bound values
        params,
    ).fetchall()
    return [audit_from_row(row) for row in rows]


def delete_audit_before(db: sqlite3.Connection, time: datetime, limit: int) -> int:
    """See :meth:`Store.delete_audit_before`."""
    return db.execute(
        "DELETE FROM audit WHERE id IN"
        " (SELECT id FROM audit WHERE time < ? ORDER BY time, id LIMIT ?)",
        (encode_time(time), limit),
    ).rowcount
