"""The state store's interface: records, errors and the abstract :class:`Store`.

Everything the server persists goes through a :class:`Store`. The records are
frozen values; every time is a timezone-aware UTC :class:`~datetime.datetime`.
Token hashes, never raw tokens, reach the store: callers hash with
:func:`hash_token`.

The errors form the store's subtree of the project's hierarchy::

    TunnelError                         (protocol.errors)
    └── StoreError                      the store failed or refused a request
        ├── StoreClosedError            the store was used after close()
        ├── SchemaVersionError          the database was written by a newer server
        ├── InvalidValueError           a value the store cannot hold: a naive datetime,
        │                               a raw token for a hash, a limit out of range
        │                               (also ValueError)
        ├── NotFoundError               no such cluster, user, grant or certificate
        ├── AlreadyExistsError          the name, serial or token is taken
        ├── QueueFullError              a cluster has as many commands waiting as allowed
        └── BootstrapTokenError         a bootstrap token was refused
            ├── TokenUnknownError       no such token
            ├── TokenUsedError          the token was used already
            ├── TokenExpiredError       the token is past its expiry
            └── TokenClusterMismatchError  the token belongs to another cluster

Messages say what is wrong and what to do; they never quote tokens or hashes.
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, NamedTuple

from protocol.errors import TunnelError
from tunnel_server.store.commands import PRUNE_BATCH, CommandStore
from tunnel_server.store.console import AuditQuery, ConsoleSession

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
    "ProxyAuditRecord",
    "SchemaVersionError",
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

AuditKind = Literal["proxy", "command", "admin"]
AUDIT_KINDS: frozenset[str] = frozenset({"proxy", "command", "admin"})

MAX_AUDIT_LIMIT = 1000
"""The most audit events one :meth:`Store.list_audit` call returns."""


def hash_token(token: str) -> str:
    """The SHA-256 hex digest under which the store keeps ``token``.

    A plain, unsalted hash suffices because tokens are high-entropy random
    strings: there is no dictionary to try, and an exact lookup stays possible.
    """
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


# --- Records ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Cluster:
    """A registered cluster, and what was last seen of its agent.

    Whether the agent is connected now is known only to the server's memory;
    the connection fields survive a restart so ``cluster list`` can show them.
    """

    name: str
    created_at: datetime
    agent_version: str | None = None
    remote_addr: str | None = None
    connected_since: datetime | None = None
    last_seen: datetime | None = None
    rbac: str = "full"
    #: With rbac "namespaced": the namespaces the agent may act in.
    namespaces: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class BootstrapToken:
    """A one-time token with which an agent obtains its first certificate."""

    token_hash: str
    cluster: str
    created_at: datetime
    expires_at: datetime
    used_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class IssuedCertificate:
    """A client certificate issued to a cluster's agent.

    ``serial`` is the X.509 serial number (up to 160 bits); ``fingerprint`` is
    whatever digest the issuer chose to record.
    """

    serial: int
    cluster: str
    fingerprint: str
    not_before: datetime
    not_after: datetime
    revoked_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class User:
    """A person or robot that uses the server's API."""

    name: str
    groups: tuple[str, ...]
    is_admin: bool
    created_at: datetime


@dataclass(frozen=True, slots=True)
class ApiToken:
    """An API token of a user, kept as its hash."""

    token_hash: str
    user: str
    created_at: datetime
    last_used_at: datetime | None = None
    #: From then on the token is refused; None: never.
    expires_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Grant:
    """What one user may do on one cluster.

    ``as_groups`` are the Kubernetes groups the user's requests are
    impersonated as; ``commands`` allows dispatching commands; ``impersonate``
    allows the user to impersonate others in turn: anyone under ``tunnel:``
    when ``impersonate_targets`` is empty, else only those it names (user
    names, and ``group:NAME`` for groups).
    """

    user: str
    cluster: str
    as_groups: tuple[str, ...] = ()
    commands: bool = False
    impersonate: bool = False
    impersonate_targets: tuple[str, ...] = ()
    #: The user's commands act as the agent, not as ``tunnel:<user>`` (an admin's choice).
    commands_as_agent: bool = False


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """One audited action. ``id`` is ``None`` until the store assigns it.

    ``user`` and ``cluster`` are plain names, not references: the trail
    outlives the users and clusters it mentions. ``detail`` must be JSON.
    """

    id: int | None
    time: datetime
    user: str | None
    cluster: str | None
    kind: AuditKind
    verb: str
    path: str | None = None
    status: int | None = None
    bytes_in: int = 0
    bytes_out: int = 0
    duration_ms: int = 0
    detail: dict[str, Any] = field(default_factory=dict)


class ProxyAuditRecord(NamedTuple):
    """One proxied request's audit event, as the proxy records it.

    Stored as an :class:`AuditEvent` of kind ``proxy``, and read back as one;
    its detail holds ``"ended": ended`` when ``ended`` is not empty, and
    ``"as": {...}`` (who the cluster was told the caller is: ``user``,
    ``groups``, and ``impersonated`` when that came from the caller's own
    ``Impersonate-*``) when ``identity`` is not. A
    tuple, not an :class:`AuditEvent`, because one is made for every proxied
    request on the event loop: it costs a fifth as much to make, and the
    store turns ``time_us`` and ``ended`` into text itself.
    """

    #: When the request ended, in microseconds since the epoch (UTC).
    time_us: int
    user: str
    cluster: str
    verb: str
    path: str
    status: int
    bytes_in: int
    bytes_out: int
    duration_ms: int
    #: Why it ended without its whole answer (a refusal, a cut), or empty.
    ended: str = ""
    #: The identity sent to the cluster, a JSON object, or empty (refused before it was
    #: decided).
    identity: str = ""
    #: Among replicas sharing a database: which received the request and which served
    #: it (the one holding the cluster's agent), a JSON object ``{"received": ...,
    #: "served": ...}`` recorded as ``"replica"`` in the detail; empty on one replica.
    replicas: str = ""


# --- Errors -------------------------------------------------------------------


class StoreError(TunnelError):
    """The state store failed or refused a request."""


class StoreClosedError(StoreError):
    """The store was used after :meth:`Store.close`."""


class SchemaVersionError(StoreError):
    """The database's schema is newer than this server knows: upgrade the server."""


class InvalidValueError(StoreError, ValueError):
    """A value the store cannot hold, or an argument out of range."""


class NotFoundError(StoreError):
    """No such cluster, user, grant or certificate."""


class AlreadyExistsError(StoreError):
    """The name, serial or token is taken already."""


class QueueFullError(StoreError):
    """A cluster has as many commands waiting for delivery as the server allows."""


class BootstrapTokenError(StoreError):
    """A bootstrap token was refused; ``cluster`` is the cluster it was presented for."""

    def __init__(self, message: str, *, cluster: str) -> None:
        super().__init__(message)
        self.cluster = cluster


def _new_token_hint(cluster: str) -> str:
    return f"issue a new one with `tunnelctl cluster token {cluster}`"


def _utc_text(time: datetime) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC")


class TokenUnknownError(BootstrapTokenError):
    """No bootstrap token has this hash: mistyped, or its cluster was deleted."""

    def __init__(self, cluster: str) -> None:
        super().__init__(
            "unknown bootstrap token; check that it was copied whole, or "
            + _new_token_hint(cluster),
            cluster=cluster,
        )


class TokenUsedError(BootstrapTokenError):
    """The bootstrap token was consumed already; each works once."""

    def __init__(self, cluster: str, used_at: datetime) -> None:
        super().__init__(
            f"bootstrap token was already used at {_utc_text(used_at)}; "
            + _new_token_hint(cluster),
            cluster=cluster,
        )
        self.used_at = used_at


class TokenExpiredError(BootstrapTokenError):
    """The bootstrap token is past its expiry."""

    def __init__(self, cluster: str, expires_at: datetime) -> None:
        super().__init__(
            f"bootstrap token expired at {_utc_text(expires_at)}; " + _new_token_hint(cluster),
            cluster=cluster,
        )
        self.expires_at = expires_at


class TokenClusterMismatchError(BootstrapTokenError):
    """The bootstrap token was issued for another cluster; it stays unused.

    ``token_cluster`` names that other cluster, for the server's log; the
    message does not, since it may reach whoever presented the token.
    """

    def __init__(self, cluster: str, token_cluster: str) -> None:
        super().__init__(
            f"bootstrap token was issued for another cluster, not {cluster!r}; "
            f"use the token issued for {cluster!r}, or " + _new_token_hint(cluster),
            cluster=cluster,
        )
        self.token_cluster = token_cluster


# --- The interface ------------------------------------------------------------


class Store(CommandStore):
    """The server's persistent state, safe to share among the server's tasks.

    Implementations open with an async class method of their own (for instance
    ``SqliteStore.open(path)``) and are closed with :meth:`close`, or by
    leaving ``async with``. Methods that look a thing up by name raise
    :class:`NotFoundError` when there is none; methods that create one raise
    :class:`AlreadyExistsError` when it exists. Every time passed in must be
    timezone-aware (:class:`InvalidValueError` otherwise) and comes back in UTC.
    """

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # --- lifecycle ---

    @abc.abstractmethod
    async def close(self) -> None:
        """Release the database; later calls raise :class:`StoreClosedError`. Idempotent."""

    @property
    @abc.abstractmethod
    def write_failure(self) -> str | None:
        """Why a write failed (disk full, I/O error), until :meth:`health` finds room again."""

    @abc.abstractmethod
    async def health(self) -> None:
        """Return if the store can serve requests, else raise :class:`StoreError`.

        After a write failed (:attr:`write_failure`), that means it can write
        again: a probe write, which clears the failure when it succeeds.
        """

    @abc.abstractmethod
    async def schema_version(self) -> int:
        """The schema version the database is at (the number of migrations applied)."""

    # --- clusters ---

    @abc.abstractmethod
    async def add_cluster(
        self, name: str, now: datetime, rbac: str = "full", namespaces: tuple[str, ...] = ()
    ) -> Cluster:
        """Register a cluster."""

    @abc.abstractmethod
    async def get_cluster(self, name: str) -> Cluster:
        """The cluster named ``name``."""

    @abc.abstractmethod
    async def list_clusters(self) -> list[Cluster]:
        """Every cluster, by name."""

    @abc.abstractmethod
    async def delete_cluster(self, name: str, now: datetime | None = None) -> None:
        """Forget a cluster, its bootstrap tokens and its grants.

        Its certificates are revoked (at ``now``, by default the present time)
        rather than forgotten, so that :meth:`revoked_serials` keeps refusing
        them even if a cluster of the same name is registered again.
        """

    @abc.abstractmethod
    async def record_connection(
        self,
        name: str,
        agent_version: str | None,
        remote_addr: str | None,
        connected_since: datetime | None,
        last_seen: datetime,
    ) -> Cluster:
        """Persist what is known of the cluster's agent, on connect or disconnect."""

    @abc.abstractmethod
    async def touch_cluster(self, name: str, last_seen: datetime) -> None:
        """Persist when the cluster's agent was last heard from."""

    # --- bootstrap tokens ---

    @abc.abstractmethod
    async def add_bootstrap_token(
        self, token_hash: str, cluster: str, now: datetime, expires_at: datetime
    ) -> BootstrapToken:
        """Keep a new bootstrap token (its hash) for ``cluster``.

        It supersedes the cluster's unused tokens, which expire at ``now``.
        """

    @abc.abstractmethod
    async def consume_bootstrap_token(
        self, token_hash: str, cluster: str, now: datetime
    ) -> BootstrapToken:
        """Check a bootstrap token and mark it used, atomically; return it as used.

        Of any number of concurrent calls with one token, at most one
        succeeds. Raises :class:`TokenUnknownError`,
        :class:`TokenClusterMismatchError` (leaving the token unused),
        :class:`TokenUsedError` or :class:`TokenExpiredError`, in that order
        of precedence.
        """

    # --- certificates ---

    @abc.abstractmethod
    async def record_certificate(
        self,
        serial: int,
        cluster: str,
        fingerprint: str,
        not_before: datetime,
        not_after: datetime,
    ) -> IssuedCertificate:
        """Record a certificate issued to ``cluster``'s agent."""

    @abc.abstractmethod
    async def get_certificate(self, serial: int) -> IssuedCertificate:
        """The certificate with this serial number."""

    @abc.abstractmethod
    async def revoked_serials(self) -> set[int]:
        """The serial numbers of every revoked certificate, for an in-memory cache."""

    @abc.abstractmethod
    async def revoke_cluster_certificates(self, cluster: str, now: datetime) -> int:
        """Revoke every unrevoked certificate of ``cluster``; return how many."""

    # --- users and API tokens ---

    @abc.abstractmethod
    async def add_user(
        self, name: str, groups: tuple[str, ...], is_admin: bool, now: datetime
    ) -> User:
        """Create a user."""

    @abc.abstractmethod
    async def get_user(self, name: str) -> User:
        """The user named ``name``."""

    @abc.abstractmethod
    async def list_users(self) -> list[User]:
        """Every user, by name."""

    @abc.abstractmethod
    async def delete_user(self, name: str) -> None:
        """Forget a user, their API tokens and their grants."""

    @abc.abstractmethod
    async def add_api_token(
        self, token_hash: str, user: str, now: datetime, expires_at: datetime | None = None
    ) -> ApiToken:
        """Keep a new API token (its hash) for ``user``, refused from ``expires_at`` on.

        Tokens that expired by ``now`` (any user's) are forgotten.
        """

    @abc.abstractmethod
    async def find_user_by_token(self, token_hash: str, now: datetime | None = None) -> User | None:
        """The user whose API token has this hash, or ``None`` (also once it expired).

        Given ``now``, the token's ``last_used_at`` is brought up to date
        (at most about once a minute, so that lookups stay cheap); its expiry
        is checked against ``now``, or else the current time.
        """

    @abc.abstractmethod
    async def list_api_tokens(self, user: str) -> list[ApiToken]:
        """The API tokens of ``user`` (their hashes and use), oldest first."""

    @abc.abstractmethod
    async def revoke_api_tokens(self, user: str) -> int:
        """Delete every API token of ``user``; return how many."""

    @abc.abstractmethod
    async def delete_api_token(self, token_hash: str) -> bool:
        """Delete the API token with this hash; False if there was none."""

    # --- grants ---

    @abc.abstractmethod
    async def set_grant(self, grant: Grant) -> None:
        """Create or replace the grant of ``grant.user`` on ``grant.cluster``."""

    @abc.abstractmethod
    async def get_grant(self, user: str, cluster: str) -> Grant:
        """The grant of ``user`` on ``cluster``."""

    @abc.abstractmethod
    async def list_grants(self, user: str | None = None, cluster: str | None = None) -> list[Grant]:
        """The grants, optionally of one user and/or on one cluster, by user then cluster."""

    @abc.abstractmethod
    async def delete_grant(self, user: str, cluster: str) -> None:
        """Remove the grant of ``user`` on ``cluster``."""

    # --- audit ---

    @abc.abstractmethod
    async def add_audit(self, event: AuditEvent) -> AuditEvent:
        """Append an event (its ``id`` is ignored); return it with the id assigned."""

    @abc.abstractmethod
    async def add_audit_events(self, events: Sequence[AuditEvent]) -> int:
        """Record many audit events in one transaction; return how many."""

    @abc.abstractmethod
    async def add_proxy_audit(self, records: Sequence[ProxyAuditRecord]) -> int:
        """Record many proxied requests' events in one transaction; return how many."""

    @abc.abstractmethod
    async def list_audit(
        self,
        cluster: str | None = None,
        user: str | None = None,
        kind: AuditKind | None = None,
        since: datetime | None = None,
        limit: int = 100,
    ) -> list[AuditEvent]:
        """Events matching every filter given, newest first.

        ``since`` is inclusive. ``limit`` must be positive and is capped at
        :data:`MAX_AUDIT_LIMIT`.
        """

    @abc.abstractmethod
    async def delete_audit_before(self, time: datetime, limit: int = PRUNE_BATCH) -> int:
        """Delete at most ``limit`` of the events older than ``time``, oldest first.

        Returns how many it deleted (retention): fewer than ``limit`` means
        none older is left.
        """

    # --- console (tunnel_server/store/console.py) ---

    @abc.abstractmethod
    async def add_console_session(self, session: ConsoleSession) -> None:
        """Keep a new console session; those expired by its ``created_at`` are forgotten.

        Raises :class:`NotFoundError` when its user or token no longer exists.
        """

    @abc.abstractmethod
    async def get_console_session(self, session_hash: str, now: datetime) -> ConsoleSession | None:
        """The console session with this hash, or None (also once it expired at ``now``)."""

    @abc.abstractmethod
    async def delete_console_session(self, session_hash: str) -> bool:
        """End the console session with this hash; False if there was none."""

    @abc.abstractmethod
    async def active_command_counts(self) -> dict[str, dict[str, int]]:
        """For each cluster that has any: how many of its commands are pending, delivered
        or running, by state (the states present)."""

    @abc.abstractmethod
    async def search_audit(self, query: AuditQuery) -> list[AuditEvent]:
        """Events matching every filter of ``query``, newest first, at most its limit
        (capped at :data:`~tunnel_server.store.console.MAX_AUDIT_SEARCH`)."""
