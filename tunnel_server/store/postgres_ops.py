"""The store's record operations, as coroutines on a connection of the PostgreSQL pool.

``PostgresStore`` runs each with a connection it lends from its pool; they
validate their arguments (:class:`InvalidValueError`) and raise the store's
errors for what they foresee. Whatever takes more than one statement runs in
one transaction; what must not interleave with another replica's work is
serialised by the database: a row lock (``FOR UPDATE``), a key lock on the
row referred to (``FOR KEY SHARE``, so that it cannot be deleted meanwhile),
or a unique constraint (``ON CONFLICT DO NOTHING``). Schema: ``postgres_schema``.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Literal

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
from tunnel_server.store.postgres_codec import (
    api_token_from_row,
    bootstrap_token_from_row,
    certificate_from_row,
    check_groups,
    check_token_hash,
    cluster_from_row,
    encode_serial,
    grant_from_row,
    optional_utc,
    user_from_row,
    utc,
)
from tunnel_server.store.postgres_schema import Connection

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
    "UPDATE certificates SET revoked_at = $1 WHERE cluster = $2 AND revoked_at IS NULL"
)


def _count(status: str) -> int:
    """The number of rows a command's status (``"UPDATE 3"``, ``"INSERT 0 1"``) names."""
    return int(status.rsplit(" ", 1)[-1])


# --- clusters -------------------------------------------------------------------


async def add_cluster(
    db: Connection, name: str, now: datetime, rbac: str, namespaces: tuple[str, ...] = ()
) -> Cluster:
    """See :meth:`Store.add_cluster`."""
    row = await db.fetchrow(
        "INSERT INTO clusters (name, created_at, rbac, namespaces) VALUES ($1, $2, $3, $4)"
        " ON CONFLICT (name) DO NOTHING RETURNING *",
        name,
        utc(now),
        rbac,
        check_groups(tuple(namespaces)),
    )
    if row is None:
        raise AlreadyExistsError(f"cluster {name!r} already exists")
    return cluster_from_row(row)


async def get_cluster(db: Connection, name: str) -> Cluster:
    """See :meth:`Store.get_cluster`."""
    row = await db.fetchrow("SELECT * FROM clusters WHERE name = $1", name)
    if row is None:
        raise _no_cluster(name)
    return cluster_from_row(row)


async def list_clusters(db: Connection) -> list[Cluster]:
    """See :meth:`Store.list_clusters`."""
    rows = await db.fetch("SELECT * FROM clusters ORDER BY name")
    return [cluster_from_row(row) for row in rows]


async def delete_cluster(db: Connection, name: str, now: datetime) -> None:
    """See :meth:`Store.delete_cluster`."""
    revoked_at = utc(now)
    async with db.transaction():
        await _require_cluster(db, name, lock="FOR UPDATE")
        await db.execute(_REVOKE_CLUSTER_CERTIFICATES, revoked_at, name)
        # Bootstrap tokens and grants follow by ON DELETE CASCADE.
        await db.execute("DELETE FROM clusters WHERE name = $1", name)


async def record_connection(
    db: Connection,
    name: str,
    agent_version: str | None,
    remote_addr: str | None,
    connected_since: datetime | None,
    last_seen: datetime,
) -> Cluster:
    """See :meth:`Store.record_connection`."""
    row = await db.fetchrow(
        "UPDATE clusters SET agent_version = $1, remote_addr = $2,"
        " connected_since = $3, last_seen = $4 WHERE name = $5 RETURNING *",
        agent_version,
        remote_addr,
        optional_utc(connected_since),
        utc(last_seen),
        name,
    )
    if row is None:
        raise _no_cluster(name)
    return cluster_from_row(row)


async def touch_cluster(db: Connection, name: str, last_seen: datetime) -> None:
    """See :meth:`Store.touch_cluster`."""
    status = await db.execute(
        "UPDATE clusters SET last_seen = $1 WHERE name = $2", utc(last_seen), name
    )
    if _count(status) == 0:
        raise _no_cluster(name)


# --- bootstrap tokens -----------------------------------------------------------


async def add_bootstrap_token(
    db: Connection, token_hash: str, cluster: str, now: datetime, expires_at: datetime
) -> BootstrapToken:
    """See :meth:`Store.add_bootstrap_token`."""
    token = BootstrapToken(
        token_hash=check_token_hash(token_hash),
        cluster=cluster,
        created_at=utc(now),
        expires_at=utc(expires_at),
    )
    async with db.transaction():
        await _require_cluster(db, cluster)
        # A new token supersedes the cluster's unused ones: they expire now.
        await db.execute(
            "UPDATE bootstrap_tokens SET expires_at = $1"
            " WHERE cluster = $2 AND used_at IS NULL AND expires_at > $1",
            token.created_at,
            cluster,
        )
        status = await db.execute(
            "INSERT INTO bootstrap_tokens (token_hash, cluster, created_at, expires_at)"
            " VALUES ($1, $2, $3, $4) ON CONFLICT (token_hash) DO NOTHING",
            token_hash,
            cluster,
            token.created_at,
            token.expires_at,
        )
        if _count(status) == 0:  # raised inside: the supersession is undone with it
            raise AlreadyExistsError("this bootstrap token is registered already")
    return token


async def consume_bootstrap_token(
    db: Connection, token_hash: str, cluster: str, now: datetime
) -> BootstrapToken:
    """See :meth:`Store.consume_bootstrap_token`."""
    check_token_hash(token_hash)
    now = utc(now)
    async with db.transaction():
        # The row lock makes concurrent consumers, in any replica, take turns: each
        # reads the row as the one before left it.
        row = await db.fetchrow(
            "SELECT * FROM bootstrap_tokens WHERE token_hash = $1 FOR UPDATE", token_hash
        )
        if row is None:
            raise TokenUnknownError(cluster)
        token = bootstrap_token_from_row(row)
        if token.cluster != cluster:
            raise TokenClusterMismatchError(cluster, token.cluster)
        if token.used_at is not None:
            raise TokenUsedError(cluster, token.used_at)
        if token.expires_at <= now:
            raise TokenExpiredError(cluster, token.expires_at)
        await db.execute(
            "UPDATE bootstrap_tokens SET used_at = $1 WHERE token_hash = $2", now, token_hash
        )
    return replace(token, used_at=now)


# --- certificates ---------------------------------------------------------------


async def record_certificate(
    db: Connection,
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
    async with db.transaction():
        await _require_cluster(db, cluster)
        status = await db.execute(
            "INSERT INTO certificates (serial, cluster, fingerprint, not_before, not_after)"
            " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (serial) DO NOTHING",
            key,
            cluster,
            fingerprint,
            certificate.not_before,
            certificate.not_after,
        )
        if _count(status) == 0:
            raise AlreadyExistsError(f"a certificate with serial {serial:#x} is recorded already")
    return certificate


async def get_certificate(db: Connection, serial: int) -> IssuedCertificate:
    """See :meth:`Store.get_certificate`."""
    row = await db.fetchrow("SELECT * FROM certificates WHERE serial = $1", encode_serial(serial))
    if row is None:
        raise NotFoundError(f"no certificate with serial {serial:#x} was issued")
    return certificate_from_row(row)


async def revoked_serials(db: Connection) -> set[int]:
    """See :meth:`Store.revoked_serials`."""
    rows = await db.fetch("SELECT serial FROM certificates WHERE revoked_at IS NOT NULL")
    return {int(row["serial"]) for row in rows}


async def revoke_cluster_certificates(db: Connection, cluster: str, now: datetime) -> int:
    """See :meth:`Store.revoke_cluster_certificates`."""
    revoked_at = utc(now)
    async with db.transaction():
        await _require_cluster(db, cluster)
        return _count(await db.execute(_REVOKE_CLUSTER_CERTIFICATES, revoked_at, cluster))


# --- users and API tokens ---------------------------------------------------------


async def add_user(
    db: Connection, name: str, groups: tuple[str, ...], is_admin: bool, now: datetime
) -> User:
    """See :meth:`Store.add_user`."""
    user = User(name=name, groups=groups, is_admin=bool(is_admin), created_at=utc(now))
    status = await db.execute(
        "INSERT INTO users (name, groups, is_admin, created_at) VALUES ($1, $2, $3, $4)"
        " ON CONFLICT (name) DO NOTHING",
        name,
        check_groups(groups),
        user.is_admin,
        user.created_at,
    )
    if _count(status) == 0:
        raise AlreadyExistsError(f"user {name!r} already exists")
    return user


async def get_user(db: Connection, name: str) -> User:
    """See :meth:`Store.get_user`."""
    row = await db.fetchrow("SELECT * FROM users WHERE name = $1", name)
    if row is None:
        raise _no_user(name)
    return user_from_row(row)


async def list_users(db: Connection) -> list[User]:
    """See :meth:`Store.list_users`."""
    rows = await db.fetch("SELECT * FROM users ORDER BY name")
    return [user_from_row(row) for row in rows]


async def delete_user(db: Connection, name: str) -> None:
    """See :meth:`Store.delete_user`."""
    # API tokens and grants follow by ON DELETE CASCADE.
    if _count(await db.execute("DELETE FROM users WHERE name = $1", name)) == 0:
        raise _no_user(name)


async def add_api_token(
    db: Connection,
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
        expires_at=optional_utc(expires_at),
    )
    async with db.transaction():
        await _require_user(db, user)
        if await db.fetchval("SELECT 1 FROM api_tokens WHERE token_hash = $1", token_hash):
            raise AlreadyExistsError("this API token is registered already")
        # Tokens that expired are forgotten as new ones come: the table stays bounded.
        await db.execute(
            "DELETE FROM api_tokens WHERE expires_at IS NOT NULL AND expires_at <= $1",
            token.created_at,
        )
        status = await db.execute(
            "INSERT INTO api_tokens (token_hash, user_name, created_at, expires_at)"
            " VALUES ($1, $2, $3, $4) ON CONFLICT (token_hash) DO NOTHING",
            token_hash,
            user,
            token.created_at,
            token.expires_at,
        )
        if _count(status) == 0:
            raise AlreadyExistsError("this API token is registered already")
    return token


async def find_user_by_token(db: Connection, token_hash: str, now: datetime | None) -> User | None:
    """See :meth:`Store.find_user_by_token`."""
    check_token_hash(token_hash)
    row = await db.fetchrow(
        "SELECT users.* FROM api_tokens JOIN users ON users.name = api_tokens.user_name"
        " WHERE api_tokens.token_hash = $1"
        " AND (api_tokens.expires_at IS NULL OR api_tokens.expires_at > $2)",
        token_hash,
        utc(now or datetime.now(UTC)),
    )
    if row is None:
        return None
    if now is not None:
        # One conditional write: at most one lookup a minute writes, in any replica.
        await db.execute(
            "UPDATE api_tokens SET last_used_at = $2 WHERE token_hash = $1"
            " AND (last_used_at IS NULL OR last_used_at < $3)",
            token_hash,
            utc(now),
            utc(now) - TOKEN_TOUCH_INTERVAL,
        )
    return user_from_row(row)


async def list_api_tokens(db: Connection, user: str) -> list[ApiToken]:
    """See :meth:`Store.list_api_tokens`."""
    await _require_user(db, user, lock="")
    rows = await db.fetch(
        "SELECT * FROM api_tokens WHERE user_name = $1 ORDER BY created_at, token_hash", user
    )
    return [api_token_from_row(row) for row in rows]


async def revoke_api_tokens(db: Connection, user: str) -> int:
    """See :meth:`Store.revoke_api_tokens`."""
    async with db.transaction():
        await _require_user(db, user)
        return _count(await db.execute("DELETE FROM api_tokens WHERE user_name = $1", user))


async def delete_api_token(db: Connection, token_hash: str) -> bool:
    """See :meth:`Store.delete_api_token`."""
    return _count(await db.execute("DELETE FROM api_tokens WHERE token_hash = $1", token_hash)) > 0


# --- grants -----------------------------------------------------------------------


async def set_grant(db: Connection, grant: Grant) -> None:
    """See :meth:`Store.set_grant`."""
    values = (
        grant.user,
        grant.cluster,
        check_groups(grant.as_groups),
        bool(grant.commands),
        bool(grant.impersonate),
        check_groups(grant.impersonate_targets),
        bool(grant.commands_as_agent),
    )
    async with db.transaction():
        await _require_user(db, grant.user)
        await _require_cluster(db, grant.cluster)
        await db.execute(
            "INSERT INTO grants"
            " (user_name, cluster, as_groups, commands, impersonate, impersonate_targets,"
            " commands_as_agent)"
            " VALUES ($1, $2, $3, $4, $5, $6, $7)"
            " ON CONFLICT (user_name, cluster) DO UPDATE SET"
            " as_groups = excluded.as_groups, commands = excluded.commands,"
            " impersonate = excluded.impersonate,"
            " impersonate_targets = excluded.impersonate_targets,"
            " commands_as_agent = excluded.commands_as_agent",
            *values,
        )


async def get_grant(db: Connection, user: str, cluster: str) -> Grant:
    """See :meth:`Store.get_grant`."""
    row = await db.fetchrow(
        "SELECT * FROM grants WHERE user_name = $1 AND cluster = $2", user, cluster
    )
    if row is None:
        raise _no_grant(user, cluster)
    return grant_from_row(row)


async def list_grants(db: Connection, user: str | None, cluster: str | None) -> list[Grant]:
    """See :meth:`Store.list_grants`."""
    rows = await db.fetch(
        "SELECT * FROM grants WHERE ($1::text IS NULL OR user_name = $1)"
        " AND ($2::text IS NULL OR cluster = $2) ORDER BY user_name, cluster",
        user,
        cluster,
    )
    return [grant_from_row(row) for row in rows]


async def delete_grant(db: Connection, user: str, cluster: str) -> None:
    """See :meth:`Store.delete_grant`."""
    status = await db.execute(
        "DELETE FROM grants WHERE user_name = $1 AND cluster = $2", user, cluster
    )
    if _count(status) == 0:
        raise _no_grant(user, cluster)


# --- lookups ----------------------------------------------------------------------

# The lock a lookup takes on the row it finds: FOR KEY SHARE lets others update the
# row but not delete it (nor change its key) until the transaction ends, so that what
# refers to it is never left dangling by a concurrent delete.
_Lock = Literal["", "FOR KEY SHARE", "FOR UPDATE"]


async def _require_cluster(db: Connection, name: str, lock: _Lock = "FOR KEY SHARE") -> None:
    if await db.fetchval(f"SELECT 1 FROM clusters WHERE name = $1 {lock}", name) is None:  # noqa: S608 - constant lock clause
        raise _no_cluster(name)


async def _require_user(db: Connection, name: str, lock: _Lock = "FOR KEY SHARE") -> None:
    if await db.fetchval(f"SELECT 1 FROM users WHERE name = $1 {lock}", name) is None:  # noqa: S608 - constant lock clause
        raise _no_user(name)


def _no_cluster(name: str) -> NotFoundError:
    return NotFoundError(f"no cluster {name!r}; see `tunnelctl cluster list`")


def _no_user(name: str) -> NotFoundError:
    return NotFoundError(f"no user {name!r}")


def _no_grant(user: str, cluster: str) -> NotFoundError:
    return NotFoundError(f"user {user!r} has no grant on cluster {cluster!r}")
