"""The store's operations, as plain functions of a sqlite3 connection.

``SqliteStore`` runs each on its database thread; they block, validate their
arguments (:class:`InvalidValueError`) and raise the store's errors for what
they foresee. Each reads and writes in one transaction where it takes more
than one statement. Schema and conventions: ``sqlite_schema``.
"""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from tunnel_server.store.base import (
    AlreadyExistsError,
    ApiToken,
    BootstrapToken,
    Cluster,
    Grant,
    IssuedCertificate,
    NotFoundError,
    TokenClusterMismatchError,
    TokenExpiredError,
    TokenUnknownError,
    TokenUsedError,
    User,
)
from tunnel_server.store.sqlite_codec import (
    api_token_from_row,
    bootstrap_token_from_row,
    certificate_from_row,
    check_token_hash,
    cluster_from_row,
    encode_groups,
    encode_serial,
    encode_time,
    grant_from_row,
    optional_time,
    user_from_row,
    utc,
)
from tunnel_server.store.sqlite_schema import transaction

__all__ = [
    "TOKEN_TOUCH_INTERVAL",
    "add_api_token",
    "add_bootstrap_token",
    "add_cluster",
    "add_user",
    "consume_bootstrap_token",
    "delete_api_token",
    "delete_cluster",
    "delete_grant",
    "delete_user",
    "find_user_by_token",
    "get_certificate",
    "get_cluster",
    "get_grant",
    "get_user",
    "list_api_tokens",
    "list_clusters",
    "list_grants",
    "list_users",
    "record_certificate",
    "record_connection",
    "revoke_api_tokens",
    "revoke_cluster_certificates",
    "revoked_serials",
    "set_grant",
    "touch_cluster",
]

TOKEN_TOUCH_INTERVAL = timedelta(minutes=1)
"""How stale an API token's ``last_used_at`` may get: a lookup writes at most this often."""

_REVOKE_CLUSTER_CERTIFICATES = (
    "UPDATE certificates SET revoked_at = ? WHERE cluster = ? AND revoked_at IS NULL"
)

# --- clusters -------------------------------------------------------------------


def add_cluster(
    db: sqlite3.Connection, name: str, now: datetime, rbac: str, namespaces: tuple[str, ...] = ()
) -> Cluster:
    """See :meth:`Store.add_cluster`."""
    cluster = Cluster(name=name, created_at=utc(now), rbac=rbac, namespaces=tuple(namespaces))
    with transaction(db):
        if _cluster_row(db, name) is not None:
            raise AlreadyExistsError(f"cluster {name!r} already exists")
        db.execute(
            "INSERT INTO clusters (name, created_at, rbac, namespaces) VALUES (?, ?, ?, ?)",
            (name, encode_time(now), rbac, encode_groups(tuple(namespaces))),
        )
    return cluster


def get_cluster(db: sqlite3.Connection, name: str) -> Cluster:
    """See :meth:`Store.get_cluster`."""
    return cluster_from_row(_require_cluster(db, name))


def list_clusters(db: sqlite3.Connection) -> list[Cluster]:
    """See :meth:`Store.list_clusters`."""
    rows = db.execute("SELECT * FROM clusters ORDER BY name").fetchall()
    return [cluster_from_row(row) for row in rows]


def delete_cluster(db: sqlite3.Connection, name: str, now: datetime) -> None:
    """See :meth:`Store.delete_cluster`."""
    revoked_at = encode_time(now)
    with transaction(db):
        _require_cluster(db, name)
        db.execute(_REVOKE_CLUSTER_CERTIFICATES, (revoked_at, name))
        # Bootstrap tokens and grants follow by ON DELETE CASCADE.
        db.execute("DELETE FROM clusters WHERE name = ?", (name,))


def record_connection(
    db: sqlite3.Connection,
    name: str,
    agent_version: str | None,
    remote_addr: str | None,
    connected_since: datetime | None,
    last_seen: datetime,
) -> Cluster:
    """See :meth:`Store.record_connection`."""
    values = (agent_version, remote_addr, optional_time(connected_since), encode_time(last_seen))
    with transaction(db):
        db.execute(
            "UPDATE clusters SET agent_version = ?, remote_addr = ?,"
            " connected_since = ?, last_seen = ? WHERE name = ?",
            (*values, name),
        )
        return cluster_from_row(_require_cluster(db, name))


def touch_cluster(db: sqlite3.Connection, name: str, last_seen: datetime) -> None:
    """See :meth:`Store.touch_cluster`."""
    seen = encode_time(last_seen)
    if db.execute("UPDATE clusters SET last_seen = ? WHERE name = ?", (seen, name)).rowcount == 0:
        raise _no_cluster(name)


# --- bootstrap tokens -----------------------------------------------------------


def add_bootstrap_token(
    db: sqlite3.Connection, token_hash: str, cluster: str, now: datetime, expires_at: datetime
) -> BootstrapToken:
    """See :meth:`Store.add_bootstrap_token`."""
    token = BootstrapToken(
        token_hash=check_token_hash(token_hash),
        cluster=cluster,
        created_at=utc(now),
        expires_at=utc(expires_at),
    )
    with transaction(db):
        _require_cluster(db, cluster)
        if db.execute(
            "SELECT 1 FROM bootstrap_tokens WHERE token_hash = ?", (token_hash,)
        ).fetchone():
            raise AlreadyExistsError("this bootstrap token is registered already")
        # A new token supersedes the cluster's unused ones: they expire now.
        db.execute(
            "UPDATE bootstrap_tokens SET expires_at = ?"
            " WHERE cluster = ? AND used_at IS NULL AND expires_at > ?",
            (encode_time(now), cluster, encode_time(now)),
        )
        db.execute(
            "INSERT INTO bootstrap_tokens (token_hash, cluster, created_at, expires_at)"
            " VALUES (?, ?, ?, ?)",
            (token_hash, cluster, encode_time(now), encode_time(expires_at)),
        )
    return token


def consume_bootstrap_token(
    db: sqlite3.Connection, token_hash: str, cluster: str, now: datetime
) -> BootstrapToken:
    """See :meth:`Store.consume_bootstrap_token`."""
    check_token_hash(token_hash)
    now = utc(now)
    # One write transaction, begun with the write lock taken: the check and the mark
    # cannot interleave with another consumer, in this process or any other.
    with transaction(db):
        row = db.execute(
            "SELECT * FROM bootstrap_tokens WHERE token_hash = ?", (token_hash,)
        ).fetchone()
        if row is None:
            raise TokenUnknownError(cluster)
        token = bootstrap_token_from_row(row)
        if token.cluster != cluster:
            raise TokenClusterMismatchError(cluster, token.cluster)
        if token.used_at is not None:
            raise TokenUsedError(cluster, token.used_at)
        if token.expires_at <= now:
            raise TokenExpiredError(cluster, token.expires_at)
        db.execute(
            "UPDATE bootstrap_tokens SET used_at = ? WHERE token_hash = ?",
            (encode_time(now), token_hash),
        )
    return replace(token, used_at=now)


# --- certificates ---------------------------------------------------------------


def record_certificate(
    db: sqlite3.Connection,
    serial: int,
    cluster: str,
    fingerprint: str,
    not_before: datetime,
    not_after: datetime,
) -> IssuedCertificate:
    """See :meth:`Store.record_certificate`."""
    key = encode_serial(serial)
    certificate = IssuedCertificate(
        serial=serial,
        cluster=cluster,
        fingerprint=fingerprint,
        not_before=utc(not_before),
        not_after=utc(not_after),
    )
    with transaction(db):
        _require_cluster(db, cluster)
        if _certificate_row(db, key) is not None:
            raise AlreadyExistsError(f"a certificate with serial {serial:#x} is recorded already")
        db.execute(
            "INSERT INTO certificates (serial, cluster, fingerprint, not_before, not_after)"
            " VALUES (?, ?, ?, ?, ?)",
            (key, cluster, fingerprint, encode_time(not_before), encode_time(not_after)),
        )
    return certificate


def get_certificate(db: sqlite3.Connection, serial: int) -> IssuedCertificate:
    """See :meth:`Store.get_certificate`."""
    row = _certificate_row(db, encode_serial(serial))
    if row is None:
        raise NotFoundError(f"no certificate with serial {serial:#x} was issued")
    return certificate_from_row(row)


def revoked_serials(db: sqlite3.Connection) -> set[int]:
    """See :meth:`Store.revoked_serials`."""
    rows = db.execute("SELECT serial FROM certificates WHERE revoked_at IS NOT NULL")
    return {int(row["serial"], 16) for row in rows}


def revoke_cluster_certificates(db: sqlite3.Connection, cluster: str, now: datetime) -> int:
    """See :meth:`Store.revoke_cluster_certificates`."""
    revoked_at = encode_time(now)
    with transaction(db):
        _require_cluster(db, cluster)
        return db.execute(_REVOKE_CLUSTER_CERTIFICATES, (revoked_at, cluster)).rowcount


# --- users and API tokens ---------------------------------------------------------


def add_user(
    db: sqlite3.Connection, name: str, groups: tuple[str, ...], is_admin: bool, now: datetime
) -> User:
    """See :meth:`Store.add_user`."""
    user = User(name=name, groups=groups, is_admin=bool(is_admin), created_at=utc(now))
    values = (name, encode_groups(groups), int(user.is_admin), encode_time(now))
    with transaction(db):
        if _user_row(db, name) is not None:
            raise AlreadyExistsError(f"user {name!r} already exists")
        db.execute(
            "INSERT INTO users (name, groups, is_admin, created_at) VALUES (?, ?, ?, ?)", values
        )
    return user


def get_user(db: sqlite3.Connection, name: str) -> User:
    """See :meth:`Store.get_user`."""
    return user_from_row(_require_user(db, name))


def list_users(db: sqlite3.Connection) -> list[User]:
    """See :meth:`Store.list_users`."""
    rows = db.execute("SELECT * FROM users ORDER BY name").fetchall()
    return [user_from_row(row) for row in rows]


def delete_user(db: sqlite3.Connection, name: str) -> None:
    """See :meth:`Store.delete_user`."""
    # API tokens and grants follow by ON DELETE CASCADE.
    if db.execute("DELETE FROM users WHERE name = ?", (name,)).rowcount == 0:
        raise _no_user(name)


def add_api_token(
    db: sqlite3.Connection,
    token_hash: str,
    user: str,
    now: datetime,
    expires_at: datetime | None = None,
) -> ApiToken:
    """See :meth:`Store.add_api_token`."""
    token = ApiToken(
        token_hash=check_token_hash(token_hash),
        user=user,
        created_at=utc(now),
        expires_at=None if expires_at is None else utc(expires_at),
    )
    with transaction(db):
        _require_user(db, user)
        if db.execute("SELECT 1 FROM api_tokens WHERE token_hash = ?", (token_hash,)).fetchone():
            raise AlreadyExistsError("this API token is registered already")
        # Tokens that expired are forgotten as new ones come: the table stays bounded.
        db.execute(
            "DELETE FROM api_tokens WHERE expires_at IS NOT NULL AND expires_at <= ?",
            (encode_time(now),),
        )
        db.execute(
            "INSERT INTO api_tokens (token_hash, user_name, created_at, expires_at)"
            " VALUES (?, ?, ?, ?)",
            (token_hash, user, encode_time(now), optional_time(expires_at)),
        )
    return token


def find_user_by_token(
    db: sqlite3.Connection, token_hash: str, now: datetime | None
) -> User | None:
    """See :meth:`Store.find_user_by_token`."""
    check_token_hash(token_hash)
    # Fixed-width UTC text compares in time order (sqlite_schema).
    row = db.execute(
        "SELECT users.*, api_tokens.last_used_at FROM api_tokens"
        " JOIN users ON users.name = api_tokens.user_name"
        " WHERE api_tokens.token_hash = ?"
        " AND (api_tokens.expires_at IS NULL OR api_tokens.expires_at > ?)",
        (token_hash, encode_time(now or datetime.now(UTC))),
    ).fetchone()
    if row is None:
        return None
    if now is not None:
        last_used_at: str | None = row["last_used_at"]
        if last_used_at is None or last_used_at < encode_time(now - TOKEN_TOUCH_INTERVAL):
            db.execute(
                "UPDATE api_tokens SET last_used_at = ? WHERE token_hash = ?",
                (encode_time(now), token_hash),
            )
    return user_from_row(row)


def list_api_tokens(db: sqlite3.Connection, user: str) -> list[ApiToken]:
    """See :meth:`Store.list_api_tokens`."""
    _require_user(db, user)
    rows = db.execute(
        "SELECT * FROM api_tokens WHERE user_name = ? ORDER BY created_at, token_hash", (user,)
    ).fetchall()
    return [api_token_from_row(row) for row in rows]


def revoke_api_tokens(db: sqlite3.Connection, user: str) -> int:
    """See :meth:`Store.revoke_api_tokens`."""
    with transaction(db):
        _require_user(db, user)
        return db.execute("DELETE FROM api_tokens WHERE user_name = ?", (user,)).rowcount


def delete_api_token(db: sqlite3.Connection, token_hash: str) -> bool:
    """See :meth:`Store.delete_api_token`."""
    with transaction(db):
        return db.execute("DELETE FROM api_tokens WHERE token_hash = ?", (token_hash,)).rowcount > 0


# --- grants -----------------------------------------------------------------------


def set_grant(db: sqlite3.Connection, grant: Grant) -> None:
    """See :meth:`Store.set_grant`."""
    values = (
        grant.user,
        grant.cluster,
        encode_groups(grant.as_groups),
        int(bool(grant.commands)),
        int(bool(grant.impersonate)),
        encode_groups(grant.impersonate_targets),
        int(bool(grant.commands_as_agent)),
    )
    with transaction(db):
        _require_user(db, grant.user)
        _require_cluster(db, grant.cluster)
        db.execute(
            "INSERT INTO grants"
            " (user_name, cluster, as_groups, commands, impersonate, impersonate_targets,"
            " commands_as_agent)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (user_name, cluster) DO UPDATE SET"
            " as_groups = excluded.as_groups, commands = excluded.commands,"
            " impersonate = excluded.impersonate,"
            " impersonate_targets = excluded.impersonate_targets,"
            " commands_as_agent = excluded.commands_as_agent",
            values,
        )


def get_grant(db: sqlite3.Connection, user: str, cluster: str) -> Grant:
    """See :meth:`Store.get_grant`."""
    row = db.execute(
        "SELECT * FROM grants WHERE user_name = ? AND cluster = ?", (user, cluster)
    ).fetchone()
    if row is None:
        raise _no_grant(user, cluster)
    return grant_from_row(row)


def list_grants(db: sqlite3.Connection, user: str | None, cluster: str | None) -> list[Grant]:
    """See :meth:`Store.list_grants`."""
    rows = db.execute(
        "SELECT * FROM grants WHERE (? IS NULL OR user_name = ?)"
        " AND (? IS NULL OR cluster = ?) ORDER BY user_name, cluster",
        (user, user, cluster, cluster),
    ).fetchall()
    return [grant_from_row(row) for row in rows]


def delete_grant(db: sqlite3.Connection, user: str, cluster: str) -> None:
    """See :meth:`Store.delete_grant`."""
    cursor = db.execute("DELETE FROM grants WHERE user_name = ? AND cluster = ?", (user, cluster))
    if cursor.rowcount == 0:
        raise _no_grant(user, cluster)


# --- lookups ----------------------------------------------------------------------


def _cluster_row(db: sqlite3.Connection, name: str) -> sqlite3.Row | None:
    row: sqlite3.Row | None = db.execute(
        "SELECT * FROM clusters WHERE name = ?", (name,)
    ).fetchone()
    return row


def _require_cluster(db: sqlite3.Connection, name: str) -> sqlite3.Row:
    row = _cluster_row(db, name)
    if row is None:
        raise _no_cluster(name)
    return row


def _user_row(db: sqlite3.Connection, name: str) -> sqlite3.Row | None:
    row: sqlite3.Row | None = db.execute("SELECT * FROM users WHERE name = ?", (name,)).fetchone()
    return row


def _require_user(db: sqlite3.Connection, name: str) -> sqlite3.Row:
    row = _user_row(db, name)
    if row is None:
        raise _no_user(name)
    return row


def _certificate_row(db: sqlite3.Connection, serial: str) -> sqlite3.Row | None:
    row: sqlite3.Row | None = db.execute(
        "SELECT * FROM certificates WHERE serial = ?", (serial,)
    ).fetchone()
    return row


def _no_cluster(name: str) -> NotFoundError:
    return NotFoundError(f"no cluster {name!r}; see `tunnelctl cluster list`")


def _no_user(name: str) -> NotFoundError:
    return NotFoundError(f"no user {name!r}")


def _no_grant(user: str, cluster: str) -> NotFoundError:
    return NotFoundError(f"user {user!r} has no grant on cluster {cluster!r}")
