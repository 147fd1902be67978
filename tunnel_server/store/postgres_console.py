"""The console's operations on PostgreSQL (see ``postgres_ops`` for the conventions).

The records are ``tunnel_server.store.console``'s; only hashes of session ids
and tokens are kept, so a session is valid on every replica sharing the database.
"""

from __future__ import annotations

from datetime import datetime

import asyncpg

from tunnel_server.store.base import AuditEvent, InvalidValueError, NotFoundError
from tunnel_server.store.console import MAX_AUDIT_SEARCH, AuditQuery, ConsoleSession
from tunnel_server.store.postgres_codec import (
    audit_from_row,
    check_kind,
    check_token_hash,
    optional_utc,
    utc,
)
from tunnel_server.store.postgres_schema import Connection

__all__ = [
    "active_command_counts",
    "add_console_session",
    "delete_console_session",
    "get_console_session",
    "search_audit",
]


async def add_console_session(db: Connection, session: ConsoleSession) -> None:
    """See :meth:`Store.add_console_session`."""
    async with db.transaction():
        await db.execute(
            "DELETE FROM console_sessions WHERE expires_at <= $1", utc(session.created_at)
        )
        try:
            await db.execute(
                "INSERT INTO console_sessions"
                " (session_hash, user_name, token_hash, created_at, expires_at)"
                " VALUES ($1, $2, $3, $4, $5)",
                check_token_hash(session.session_hash),
                session.user,
                check_token_hash(session.token_hash),
                utc(session.created_at),
                utc(session.expires_at),
            )
        except asyncpg.ForeignKeyViolationError as exc:
            raise NotFoundError(f"no user {session.user!r} with that API token") from exc


async def get_console_session(
    db: Connection, session_hash: str, now: datetime
) -> ConsoleSession | None:
    """See :meth:`Store.get_console_session`."""
    row = await db.fetchrow(
        "SELECT * FROM console_sessions WHERE session_hash = $1 AND expires_at > $2",
        check_token_hash(session_hash),
        utc(now),
    )
    if row is None:
        return None
    return ConsoleSession(
        session_hash=row["session_hash"],
        user=row["user_name"],
        token_hash=row["token_hash"],
        created_at=utc(row["created_at"]),
        expires_at=utc(row["expires_at"]),
    )


async def delete_console_session(db: Connection, session_hash: str) -> bool:
    """See :meth:`Store.delete_console_session`."""
    status = await db.execute(
        "DELETE FROM console_sessions WHERE session_hash = $1", check_token_hash(session_hash)
    )
    return int(status.rsplit(" ", 1)[-1]) > 0


async def active_command_counts(db: Connection) -> dict[str, dict[str, int]]:
    """See :meth:`Store.active_command_counts`."""
    counts: dict[str, dict[str, int]] = {}
    for row in await db.fetch(
        "SELECT cluster, state, count(*) AS n FROM commands"
        " WHERE state IN ('pending', 'delivered', 'running') GROUP BY cluster, state"
    ):
        counts.setdefault(row["cluster"], {})[row["state"]] = int(row["n"])
    return counts


async def search_audit(db: Connection, query: AuditQuery) -> list[AuditEvent]:
    """See :meth:`Store.search_audit`."""
    limit = query.limit
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidValueError(f"the audit limit must be a positive integer, not {limit!r}")
    clauses: list[str] = []
    params: list[object] = []
    for column, operator, value in (
        ("cluster", "=", query.cluster),
        ("user_name", "=", query.user),
        ("kind", "=", None if query.kind is None else check_kind(query.kind)),
        ("verb", "=", query.verb),
        ("status", "=", query.status),
        ("time", ">=", optional_utc(query.since)),
        ("time", "<", optional_utc(query.until)),
    ):
        if value is not None:
            params.append(value)
            clauses.append(f"{column} {operator} ${len(params)}")
    where = f"WHERE {' AND '.join(clauses)} " if clauses else ""
    params.append(min(limit, MAX_AUDIT_SEARCH))
    rows = await db.fetch(
        f"SELECT * FROM audit {where}ORDER BY time DESC, id DESC LIMIT ${len(params)}",  # noqa: S608 - constant fragments, bound values
        *params,
    )
    return [audit_from_row(row) for row in rows]
