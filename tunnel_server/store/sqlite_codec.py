"""How the store's values map to SQLite columns and back (conventions in ``sqlite_schema``).

Encoders validate what they are given and raise :class:`InvalidValueError`,
so that a bad value is refused before any database work starts.
"""

from __future__ import annotations

import json
import re
import sqlite3
from datetime import UTC, datetime
from typing import Any, cast

from tunnel_server.store.base import (
    AUDIT_KINDS,
    ApiToken,
    AuditEvent,
    AuditKind,
    BootstrapToken,
    Cluster,
    Grant,
    InvalidValueError,
    IssuedCertificate,
    User,
)

__all__ = [
    "MAX_AUDIT_DETAIL_BYTES",
    "MAX_SERIAL",
    "api_token_from_row",
    "audit_from_row",
    "bootstrap_token_from_row",
    "certificate_from_row",
    "check_kind",
    "check_token_hash",
    "cluster_from_row",
    "decode_time",
    "encode_detail",
    "encode_groups",
    "encode_serial",
    "encode_time",
    "grant_from_row",
    "optional_time",
    "user_from_row",
    "utc",
]

MAX_SERIAL = 2**160 - 1
"""The largest X.509 serial number (RFC 5280, section 4.1.2.2: at most 20 octets)."""

MAX_AUDIT_DETAIL_BYTES = 64 * 1024
"""The largest ``AuditEvent.detail``, as JSON: the trail must not grow without bound."""

_TOKEN_HASH = re.compile(r"[0-9a-f]{64}")
# What json.dumps(separators=..., allow_nan=False, sort_keys=True) builds on every call.
_DETAIL_JSON = json.JSONEncoder(separators=(",", ":"), allow_nan=False, sort_keys=True)


def utc(value: datetime) -> datetime:
    """``value`` in UTC; a naive time is refused rather than guessed at."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidValueError("the store needs timezone-aware times; pass datetime.now(UTC)")
    return value.astimezone(UTC)


def encode_time(value: datetime) -> str:
    """``value`` as fixed-width ISO 8601 text in UTC."""
    return utc(value).isoformat(timespec="microseconds")


def optional_time(value: datetime | None) -> str | None:
    """:func:`encode_time`, passing ``None`` through."""
    return None if value is None else encode_time(value)


def decode_time(text: str) -> datetime:
    """A time read back from a column."""
    return datetime.fromisoformat(text).astimezone(UTC)


def _decode_optional_time(text: str | None) -> datetime | None:
    return None if text is None else decode_time(text)


def check_token_hash(token_hash: str) -> str:
    """``token_hash`` if it is a SHA-256 hex digest; the store never takes a raw token."""
    if not isinstance(token_hash, str) or _TOKEN_HASH.fullmatch(token_hash) is None:
        raise InvalidValueError(
            "expected a token's SHA-256 hex digest; hash the token with hash_token() first"
        )
    return token_hash


def encode_serial(serial: int) -> str:
    """A certificate serial number as lowercase hex."""
    if isinstance(serial, bool) or not isinstance(serial, int) or not 0 <= serial <= MAX_SERIAL:
        raise InvalidValueError("a certificate serial number is an integer of at most 160 bits")
    return format(serial, "x")


def encode_groups(groups: tuple[str, ...]) -> str:
    """A tuple of group names as a JSON array."""
    if not isinstance(groups, tuple) or not all(isinstance(g, str) for g in groups):
        raise InvalidValueError("groups must be a tuple of strings")
    return json.dumps(list(groups))


def _decode_groups(text: str) -> tuple[str, ...]:
    return tuple(str(group) for group in json.loads(text))


def check_kind(kind: str) -> AuditKind:
    """``kind`` if it is an audit event kind."""
    if kind not in AUDIT_KINDS:
        raise InvalidValueError(
            f"audit kind must be one of {', '.join(sorted(AUDIT_KINDS))}, not {kind!r}"
        )
    return cast(AuditKind, kind)


def encode_detail(detail: dict[str, Any]) -> str:
    """An audit event's detail as compact JSON, of bounded size."""
    if not isinstance(detail, dict):
        raise InvalidValueError("audit detail must be a JSON object (a dict)")
    if not detail:
        return "{}"  # every proxied request's event: no encoder run per row
    try:
        text = _DETAIL_JSON.encode(detail)
    except (TypeError, ValueError) as exc:
        raise InvalidValueError(f"audit detail must be plain JSON: {exc}") from exc
    if len(text.encode("utf-8")) > MAX_AUDIT_DETAIL_BYTES:
        raise InvalidValueError(
            f"audit detail is over {MAX_AUDIT_DETAIL_BYTES} bytes as JSON; record less"
        )
    return text


def _decode_detail(text: str) -> dict[str, Any]:
    value = json.loads(text)
    return value if isinstance(value, dict) else {}


def cluster_from_row(row: sqlite3.Row) -> Cluster:
    """A ``clusters`` row as a record."""
    return Cluster(
        name=row["name"],
        created_at=decode_time(row["created_at"]),
        agent_version=row["agent_version"],
        remote_addr=row["remote_addr"],
        connected_since=_decode_optional_time(row["connected_since"]),
        last_seen=_decode_optional_time(row["last_seen"]),
        rbac=row["rbac"],
        namespaces=_decode_groups(row["namespaces"]),
    )


def bootstrap_token_from_row(row: sqlite3.Row) -> BootstrapToken:
    """A ``bootstrap_tokens`` row as a record."""
    return BootstrapToken(
        token_hash=row["token_hash"],
        cluster=row["cluster"],
        created_at=decode_time(row["created_at"]),
        expires_at=decode_time(row["expires_at"]),
        used_at=_decode_optional_time(row["used_at"]),
    )


def certificate_from_row(row: sqlite3.Row) -> IssuedCertificate:
    """A ``certificates`` row as a record."""
    return IssuedCertificate(
        serial=int(row["serial"], 16),
        cluster=row["cluster"],
        fingerprint=row["fingerprint"],
        not_before=decode_time(row["not_before"]),
        not_after=decode_time(row["not_after"]),
        revoked_at=_decode_optional_time(row["revoked_at"]),
    )


def user_from_row(row: sqlite3.Row) -> User:
    """A ``users`` row as a record."""
    return User(
        name=row["name"],
        groups=_decode_groups(row["groups"]),
        is_admin=bool(row["is_admin"]),
        created_at=decode_time(row["created_at"]),
    )


def api_token_from_row(row: sqlite3.Row) -> ApiToken:
    """An ``api_tokens`` row as a record."""
    return ApiToken(
        token_hash=row["token_hash"],
        user=row["user_name"],
        created_at=decode_time(row["created_at"]),
        last_used_at=_decode_optional_time(row["last_used_at"]),
        expires_at=_decode_optional_time(row["expires_at"]),
    )


def grant_from_row(row: sqlite3.Row) -> Grant:
    """A ``grants`` row as a record."""
    return Grant(
        user=row["user_name"],
        cluster=row["cluster"],
        as_groups=_decode_groups(row["as_groups"]),
        commands=bool(row["commands"]),
        impersonate=bool(row["impersonate"]),
        impersonate_targets=_decode_groups(row["impersonate_targets"]),
        commands_as_agent=bool(row["commands_as_agent"]),
    )


def audit_from_row(row: sqlite3.Row) -> AuditEvent:
    """An ``audit`` row as a record."""
    return AuditEvent(
        id=row["id"],
        time=decode_time(row["time"]),
        user=row["user_name"],
        cluster=row["cluster"],
        kind=check_kind(row["kind"]),
        verb=row["verb"],
        path=row["path"],
        status=row["status"],
        bytes_in=row["bytes_in"],
        bytes_out=row["bytes_out"],
        duration_ms=row["duration_ms"],
        detail=_decode_detail(row["detail"]),
    )
