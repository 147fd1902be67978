"""The audit trail's operations on PostgreSQL (see ``postgres_ops`` for the conventions).

Every proxied request writes one row, in batches (``AuditWriter``): a batch
of proxied requests is one statement whose parameters are one array per
column, so a batch of any size costs one round trip, and PostgreSQL builds
the times and the details.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime

from tunnel_server.store.base import (
    MAX_AUDIT_LIMIT,
    AuditEvent,
    AuditKind,
    InvalidValueError,
    ProxyAuditRecord,
)
from tunnel_server.store.postgres_codec import (
    audit_from_row,
    check_kind,
    encode_detail,
    optional_utc,
    utc,
)
from tunnel_server.store.postgres_schema import Connection

__all__ = [
    "add_audit",
    "add_audit_events",
    "add_proxy_audit",
    "delete_audit_before",
    "list_audit",
]

_INSERT_AUDIT = (
    "INSERT INTO audit (time, user_name, cluster, kind, verb, path, status,"
    " bytes_in, bytes_out, duration_ms, detail)"
    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11::jsonb)"
)


def _audit_row(event: AuditEvent) -> tuple[object, ...]:
    return (
        utc(event.time),
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


async def add_audit(db: Connection, event: AuditEvent) -> AuditEvent:
    """See :meth:`Store.add_audit`."""
    event_id = await db.fetchval(_INSERT_AUDIT + " RETURNING id", *_audit_row(event))
    return replace(event, id=int(event_id), time=utc(event.time))


async def add_audit_events(db: Connection, events: Sequence[AuditEvent]) -> int:
    """See :meth:`Store.add_audit_events`: one transaction for the batch."""
    rows = [_audit_row(event) for event in events]  # validated before any is sent
    async with db.transaction():
        await db.executemany(_INSERT_AUDIT, rows)
    return len(rows)


# The time is microseconds after the epoch; the detail holds "ended", "as" and
# "replica" where they are not empty, else it is the empty object. WITH ORDINALITY keeps the batch's
# order in the ids the rows are given.
_INSERT_PROXY_AUDIT = """
    INSERT INTO audit (time, user_name, cluster, kind, verb, path, status,
                       bytes_in, bytes_out, duration_ms, detail)
    SELECT timestamptz 'epoch' + r.time_us * interval '1 microsecond',
           r.user_name, r.cluster, 'proxy', r.verb, r.path, r.status,
           r.bytes_in, r.bytes_out, r.duration_ms,
           CASE WHEN r.identity = '' THEN
                CASE WHEN r.ended = '' THEN '{}'::jsonb
                     ELSE jsonb_build_object('ended', r.ended) END
                WHEN r.ended = '' THEN jsonb_build_object('as', r.identity::jsonb)
                ELSE jsonb_build_object('ended', r.ended, 'as', r.identity::jsonb) END
           || CASE WHEN r.replicas = '' THEN '{}'::jsonb
                   ELSE jsonb_build_object('replica', r.replicas::jsonb) END
    FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[],
                $6::integer[], $7::bigint[], $8::bigint[], $9::bigint[], $10::text[],
                $11::text[], $12::text[])
         WITH ORDINALITY AS r (time_us, user_name, cluster, verb, path, status,
                               bytes_in, bytes_out, duration_ms, ended, identity, replicas, n)
    ORDER BY r.n
"""


async def add_proxy_audit(db: Connection, records: Sequence[ProxyAuditRecord]) -> int:
    """See :meth:`Store.add_proxy_audit`: one statement for the batch."""
    for record in records:
        if record.time_us < 0:
            raise InvalidValueError("an audit time before 1970 cannot be stored")
    if not records:
        return 0
    columns = [list(column) for column in zip(*records, strict=True)]
    await db.execute(_INSERT_PROXY_AUDIT, *columns)
    return len(records)


async def list_audit(
    db: Connection,
    cluster: str | None,
    user: str | None,
    kind: AuditKind | None,
    since: datetime | None,
    limit: int,
) -> list[AuditEvent]:
    """See :meth:`Store.list_audit`."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidValueError(f"the audit limit must be a positive integer, not {limit!r}")
    # Only the filters given enter the query, so that the planner can use the matching index.
    clauses: list[str] = []
    params: list[object] = []
    for column, operator, value in (
        ("cluster", "=", cluster),
        ("user_name", "=", user),
        ("kind", "=", None if kind is None else check_kind(kind)),
        ("time", ">=", optional_utc(since)),
    ):
        if value is not None:
            params.append(value)
            clauses.append(f"{column} {operator} ${len(params)}")
    where = f"WHERE {' AND '.join(clauses)} " if clauses else ""
    params.append(min(limit, MAX_AUDIT_LIMIT))
    rows = await db.fetch(
        f"SELECT * FROM audit {where}ORDER BY time DESC, id DESC LIMIT ${len(params)}",  # noqa: S608 - constant fragments, bound values
        *params,
    )
    return [audit_from_row(row) for row in rows]


async def delete_audit_before(db: Connection, time: datetime, limit: int) -> int:
    """See :meth:`Store.delete_audit_before`.

    Rows another replica's pruning has locked are skipped, not waited for:
    two prunings at once share the work instead of queueing on it.
    """
    status = await db.execute(
        "DELETE FROM audit WHERE id IN (SELECT id FROM audit WHERE time < $1"
        " ORDER BY time, id LIMIT $2 FOR UPDATE SKIP LOCKED)",
        utc(time),
        limit,
    )
    return int(status.rsplit(" ", 1)[-1])
