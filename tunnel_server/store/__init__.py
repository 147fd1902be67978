"""The tunnel server's persistent state: clusters, tokens, certificates, users, grants, audit.

Everything the server persists goes through the :class:`Store` interface, and
no SQL lives outside this package. :class:`SqliteStore` keeps the state in one
SQLite file, for a single replica; :class:`PostgresStore` keeps it in a
PostgreSQL database that several replicas can share. Each engine's SQL lives in
modules of its own (``sqlite*``, ``postgres*``). Depends on ``protocol`` (for
the error root), asyncpg (the PostgreSQL engine's driver) and the standard
library only.
"""

from typing import TYPE_CHECKING, Any

from tunnel_server.store.base import (
    AUDIT_KINDS,
    MAX_AUDIT_LIMIT,
    AlreadyExistsError,
    ApiToken,
    AuditEvent,
    AuditKind,
    BootstrapToken,
    BootstrapTokenError,
    Cluster,
    Grant,
    InvalidValueError,
    IssuedCertificate,
    NotFoundError,
    ProxyAuditRecord,
    QueueFullError,
    SchemaVersionError,
    Store,
    StoreClosedError,
    StoreError,
    TokenClusterMismatchError,
    TokenExpiredError,
    TokenUnknownError,
    TokenUsedError,
    User,
    hash_token,
)
from tunnel_server.store.sqlite import SqliteStore

if TYPE_CHECKING:
    from tunnel_server.store.postgres import PostgresStore

__all__ = [
    "AUDIT_KINDS",
    "MAX_AUDIT_LIMIT",
    "AlreadyExistsError",
    "ApiToken",
    "AuditEvent",
    "AuditKind",
    "BootstrapToken",
    "BootstrapTokenError",
    "Cluster",
    "Grant",
    "InvalidValueError",
    "IssuedCertificate",
    "NotFoundError",
    "PostgresStore",
    "ProxyAuditRecord",
    "QueueFullError",
    "SchemaVersionError",
    "SqliteStore",
    "Store",
    "StoreClosedError",
    "StoreError",
    "TokenClusterMismatchError",
    "TokenExpiredError",
    "TokenUnknownError",
    "TokenUsedError",
    "User",
    "hash_token",
]


def __getattr__(name: str) -> Any:
    """``PostgresStore``, imported when first asked for (PEP 562).

    A server on SQLite never loads asyncpg (about 3 MiB of memory), though
    everything of the server imports this package.
    """
    if name == "PostgresStore":
        from tunnel_server.store.postgres import PostgresStore

        return PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
