"""The console's operations on SQLite, as plain functions of a sqlite3 connection.

Like ``sqlite_ops``: ``SqliteStore`` runs each on its database thread. The
records are ``tunnel_server.store.console``'s; only hashes of session ids and
tokens are kept.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime

from tunnel_server.store.base import AuditEvent, InvalidValueError, NotFoundError
from tunnel_server.store.console import MAX_AUDIT_SEARCH, AuditQuery, ConsoleSession
from tunnel_server.store.sqlite_codec import (
    audit_from_row,
    check_kind,
    check_token_hash,
    decode_time,
    encode_time,
    optional_time,
)
from tunnel_server.store.sqlite_schema import transaction

__all__ = [
    "active_command_counts",
    "add_console_session",
    "delete_console_session",
    "get_console_session",
    "search_audit",
]


def add_console_session(db: sqlite3.Connection, session: ConsoleSession) -> None:
    """See :meth:`Store.add_console_session`."""
    with transaction(db):
        db.execute(
            "DELETE FROM console_sessions WHERE expires_at <= ?",
            (encode_time(session.created_at),),
        )
        try:
            db.execute(
                "INSERT INTO console_sessions"
                " (session_hash, user_name, token_hash, created_at, expires_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (
                    check_token_hash(session.session_hash),
                    session.user,
                    check_token_hash(session.token_hash),
                    encode_time(session.created_at),
                    encode_time(session.expires_at),
                ),
            )
        except sqlite3.IntegrityError as exc:
            if getattr(exc, "sqlite_errorname", "") == "SQLITE_CONSTRAINT_FOREIGNKEY":
                raise NotFoundError(f"no user {session.user!r} with that API token") from exc
            raise


def get_console_session(
    db: sqlite3.Connection, session_hash: str, now: datetime
) -> ConsoleSession | None:
    """See :meth:`Store.get_console_session`."""
    row = db.execute(
        "SELECT * FROM console_sessions WHERE session_hash = ? AND expires_at > ?",
        (check_token_hash(session_hash), encode_time(now)),
    ).fetchone()
    if row is None:
        return None
    return ConsoleSession(
        session_hash=row["session_hash"],
        user=row["user_name"],
        token_hash=row["token_hash"],
        created_at=decode_time(row["created_at"]),
        expires_at=decode_time(row["expires_at"]),
    )


def delete_console_session(db: sqlite3.Connection, session_hash: str) -> bool:
    """See :meth:`Store.delete_console_session`."""
    cursor = db.execute(
        "DELETE FROM console_sessions WHERE session_hash = ?", (check_token_hash(session_hash),)
    )
    return cursor.rowcount > 0


def active_command_counts(db: sqlite3.Connection) -> dict[str, dict[str, int]]:
    """See :meth:`Store.active_command_counts`."""
    counts: dict[str, dict[str, int]] = {}
    for row in db.execute(
        "SELECT cluster, state, count(*) AS n FROM commands"
        " WHERE state IN ('pending', 'delivered', 'running') GROUP BY cluster, state"
    ):
        counts.setdefault(row["cluster"], {})[row["state"]] = int(row["n"])
    return counts


def search_audit(db: sqlite3.Connection, query: AuditQuery) -> list[AuditEvent]:
    """See :meth:`Store.search_audit`."""
    limit = query.limit
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidValueError(f"the audit limit must be a positive integer, not {limit!r}")
    clauses: list[str] = []
    params: list[object] = []
    for clause, value in (
        ("cluster = ?", query.cluster),
        ("user_name = ?", query.user),
        ("kind = ?", None if query.kind is None else check_kind(query.kind)),
        ("verb = ?", query.verb),
        ("status = ?", query.status),
        ("time >= ?", optional_time(query.since)),
        ("time < ?", optional_time(query.until)),
    ):
        if value is not None:
            clauses.append(clause)
            params.append(value)
    where = f"WHERE {' AND '.join(clauses)} " if clauses else ""
    params.append(min(limit, MAX_AUDIT_SEARCH))
    rows = db.execute(
        f"SELECT * FROM audit {where}ORDER BY time DESC, id DESC LIMIT ?",  # noqa: S608 - constant fragments, bound values
        params,
    ).fetchall()
    return [audit_from_row(row) for row in rows]
