"""How the store's values map to PostgreSQL columns and back (``postgres_schema``).

The checks of what the store can hold are the engine's neighbours'
(``sqlite_codec``: aware times, token hashes, serial ranges, audit kinds and
detail sizes), so that both engines refuse the same values with the same
words; only the column types differ.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from asyncpg import Record

from tunnel_server.store.base import (
    ApiToken,
    AuditEvent,
    BootstrapToken,
    Cluster,
    Grant,
    InvalidValueError,
    IssuedCertificate,
    User,
)
from tunnel_server.store.commands import CommandRecord
from tunnel_server.store.sqlite_codec import (
    MAX_SERIAL,
    check_kind,
    check_token_hash,
    encode_detail,
    utc,
)

__all__ = [
    "api_token_from_row",
    "audit_from_row",
    "bootstrap_token_from_row",
    "certificate_from_row",
    "check_groups",
    "check_kind",
    "check_token_hash",
    "cluster_from_row",
    "command_from_row",
    "encode_detail",
    "encode_json",
    "encode_serial",
    "grant_from_row",
    "optional_utc",
    "user_from_row",
    "utc",
]


def optional_utc(value: datetime | None) -> datetime | None:
    """:func:`utc`, passing ``None`` through."""
    return None if value is None else utc(value)


def encode_serial(serial: int) -> Decimal:
    """A certificate serial number as NUMERIC, if X.509 allows it."""
    if isinstance(serial, bool) or not isinstance(serial, int) or not 0 <= serial <= MAX_SERIAL:
        raise InvalidValueError("a certificate serial number is an integer of at most 160 bits")
    return Decimal(serial)


def check_groups(groups: tuple[str, ...]) -> list[str]:
    """A tuple of group names as a TEXT[] parameter."""
    if not isinstance(groups, tuple) or not all(isinstance(g, str) for g in groups):
        raise InvalidValueError("groups must be a tuple of strings")
    return list(groups)


def encode_json(value: Any) -> str:
    """``value`` as JSON text for a JSONB column (a command's spec or result)."""
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidValueError(f"the value must be plain JSON: {exc}") from exc


def _time(value: datetime | None) -> datetime | None:
    return None if value is None else value.astimezone(UTC)


def _required_time(value: datetime) -> datetime:
    return value.astimezone(UTC)


def _json_object(text: str | None) -> dict[str, Any]:
    value = json.loads(text) if text is not None else {}
    return value if isinstance(value, dict) else {}


def _strings(values: Sequence[str] | None) -> tuple[str, ...]:
    return tuple(values or ())


def cluster_from_row(row: Record) -> Cluster:
    """A ``clusters`` row as a record."""
    return Cluster(
        name=row["name"],
        created_at=_required_time(row["created_at"]),
        agent_version=row["agent_version"],
        remote_addr=row["remote_addr"],
        connected_since=_time(row["connected_since"]),
        last_seen=_time(row["last_seen"]),
        rbac=row["rbac"],
        namespaces=_strings(row["namespaces"]),
    )


def bootstrap_token_from_row(row: Record) -> BootstrapToken:
    """A ``bootstrap_tokens`` row as a record."""
    return BootstrapToken(
        token_hash=row["token_hash"],
        cluster=row["cluster"],
        created_at=_required_time(row["created_at"]),
        expires_at=_required_time(row["expires_at"]),
        used_at=_time(row["used_at"]),
    )


def certificate_from_row(row: Record) -> IssuedCertificate:
    """A ``certificates`` row as a record."""
    return IssuedCertificate(
        serial=int(row["serial"]),
        cluster=row["cluster"],
        fingerprint=row["fingerprint"],
        not_before=_required_time(row["not_before"]),
        not_after=_required_time(row["not_after"]),
        revoked_at=_time(row["revoked_at"]),
    )


def user_from_row(row: Record) -> User:
    """A ``users`` row as a record."""
    return User(
        name=row["name"],
        groups=_strings(row["groups"]),
        is_admin=bool(row["is_admin"]),
        created_at=_required_time(row["created_at"]),
    )


def api_token_from_row(row: Record) -> ApiToken:
    """An ``api_tokens`` row as a record."""
    return ApiToken(
        token_hash=row["token_hash"],
        user=row["user_name"],
        created_at=_required_time(row["created_at"]),
        last_used_at=_time(row["last_used_at"]),
        expires_at=_time(row["expires_at"]),
    )


def grant_from_row(row: Record) -> Grant:
    """A ``grants`` row as a record."""
    return Grant(
        user=row["user_name"],
        cluster=row["cluster"],
        as_groups=_strings(row["as_groups"]),
        commands=bool(row["commands"]),
        impersonate=bool(row["impersonate"]),
        impersonate_targets=_strings(row["impersonate_targets"]),
        commands_as_agent=bool(row["commands_as_agent"]),
    )


def audit_from_row(row: Record) -> AuditEvent:
    """An ``audit`` row as a record."""
    return AuditEvent(
        id=row["id"],
        time=_required_time(row["time"]),
        user=row["user_name"],
        cluster=row["cluster"],
        kind=check_kind(row["kind"]),
        verb=row["verb"],
        path=row["path"],
        status=row["status"],
        bytes_in=row["bytes_in"],
        bytes_out=row["bytes_out"],
        duration_ms=row["duration_ms"],
        detail=_json_object(row["detail"]),
    )


def command_from_row(row: Record) -> CommandRecord:
    """A ``commands`` row as a record."""
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
        created_at=_required_time(row["created_at"]),
        updated_at=_required_time(row["updated_at"]),
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
