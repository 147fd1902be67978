"""The shared store: PostgreSQL, for servers that run as several replicas.

asyncpg speaks PostgreSQL's protocol natively on the event loop, with a
bounded pool of its own: each call borrows a connection for its
operation (``postgres_ops``, ``postgres_audit``, ``postgres_commands``) and
gives it back. Every connection carries a ``statement_timeout`` (and the
client a ``command_timeout`` a little longer, for a server that stops
answering altogether), and an ``idle_in_transaction_session_timeout``, so
that no call and no forgotten transaction holds rows for long.

Correctness among replicas comes from the database alone: transactions, row
locks, unique constraints and conditional updates (``postgres_commands``
explains the queue's). asyncpg's exceptions, and the OSErrors of reaching
the server, are translated into the store's errors where each call returns
(``postgres_errors``), once; their text never carries the connection URL's
password. Schema: ``postgres_schema``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Concatenate, ParamSpec, TypeVar

import asyncpg
from asyncpg import Record

from tunnel_server.store import postgres_audit as audit_ops
from tunnel_server.store import postgres_commands as cmd_ops
from tunnel_server.store import postgres_console as console_ops
from tunnel_server.store import postgres_ops as ops
from tunnel_server.store import postgres_replicas as replica_ops
from tunnel_server.store import postgres_schema
from tunnel_server.store.base import (
    ApiToken,
    AuditEvent,
    AuditKind,
    BootstrapToken,
    Cluster,
    Grant,
    InvalidValueError,
    IssuedCertificate,
    ProxyAuditRecord,
    Store,
    StoreClosedError,
    StoreError,
    User,
)
from tunnel_server.store.commands import (
    PRUNE_BATCH,
    CommandLogLine,
    CommandRecord,
    CommandState,
    LapsedLease,
    NewCommand,
)
from tunnel_server.store.console import AuditQuery, ConsoleSession
from tunnel_server.store.postgres_errors import (
    CANNOT_WRITE,
    RETRY_STATES,
    message,
    redact_url,
    translate,
)
from tunnel_server.store.postgres_listener import listening
from tunnel_server.store.postgres_schema import Connection
from tunnel_server.store.replicas import ReplicaRecord, ReplicaStore, SessionOwner, StoreEvent

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MIN_CONNECTIONS",
    "DEFAULT_STATEMENT_TIMEOUT",
    "PostgresStore",
    "redact_url",
]

logger = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

DEFAULT_MIN_CONNECTIONS = 1
"""Connections the pool keeps open even when idle."""
DEFAULT_MAX_CONNECTIONS = 10
"""The most connections one replica opens: the pool's bound."""
DEFAULT_STATEMENT_TIMEOUT = 10.0
"""Seconds a statement may run (or wait for a lock) before the server cancels it."""
DEFAULT_CONNECT_TIMEOUT = 10.0
"""Seconds to reach the server and log in."""
DEFAULT_ACQUIRE_TIMEOUT = 30.0
"""Seconds a call waits for a connection of the pool while all are busy."""
IDLE_IN_TRANSACTION_TIMEOUT = 60.0
"""Seconds the server lets a connection sit in an open transaction before ending it."""
CLOSE_TIMEOUT = 10.0
"""Seconds :meth:`PostgresStore.close` waits for calls in flight before cutting them off."""
PROBE_SPACING = 1.0
"""Seconds between probe writes of a store that cannot write (``health``)."""
RETRIES = 3
"""Attempts of an operation the server aborted for a deadlock or a serialization failure."""


class PostgresStore(Store, ReplicaStore):
    """A :class:`Store` in a PostgreSQL database, which replicas share
    (:class:`ReplicaStore`). Create it with :meth:`open`."""

    def __init__(
        self, pool: asyncpg.Pool[Record], where: str, acquire_timeout: float, url: str = ""
    ) -> None:
        """Use :meth:`open`; this adopts a pool whose database is migrated."""
        self._pool = pool
        self._url = url  # for the listener's own connection; never logged
        self._where = where
        self._acquire_timeout = acquire_timeout
        self._closed = False
        self._write_failure: str | None = None
        #: When a failing store was last probed (on ``clock``), and why the probe failed.
        self.clock: Callable[[], float] = time.monotonic
        self._probed_at = float("-inf")
        self._probe_failure: str | None = None

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        min_connections: int = DEFAULT_MIN_CONNECTIONS,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        statement_timeout: float = DEFAULT_STATEMENT_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        acquire_timeout: float = DEFAULT_ACQUIRE_TIMEOUT,
    ) -> PostgresStore:
        """Connect to the database at ``url`` (``postgresql://user@host:port/db``) and
        migrate it as needed; the pool holds ``min_connections`` to ``max_connections``."""
        if not 0 <= min_connections <= max_connections or max_connections < 1:
            raise InvalidValueError(
                "the state database's pool needs 0 <= min_connections <= max_connections,"
                " and max_connections >= 1"
            )
        if statement_timeout <= 0:
            raise InvalidValueError("the statement timeout must be positive")
        where = redact_url(url)
        milliseconds = str(max(1, round(statement_timeout * 1000)))
        try:
            pool: asyncpg.Pool[Record] = await asyncpg.create_pool(
                url,
                min_size=min_connections,
                max_size=max_connections,
                timeout=connect_timeout,
                # The client's own limit, beyond the server's: for a server that is gone.
                command_timeout=statement_timeout + connect_timeout,
                server_settings={
                    "statement_timeout": milliseconds,
                    "idle_in_transaction_session_timeout": str(
                        round(IDLE_IN_TRANSACTION_TIMEOUT * 1000)
                    ),
                    "application_name": "tunnel-server",
                    "TimeZone": "UTC",
                },
            )
        except (ValueError, asyncpg.exceptions.ClientConfigurationError) as exc:
            # Their text may quote the URL, password and all.
            raise StoreError(
                f"the state database URL {where} is not valid: use"
                " postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE"
            ) from exc
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:
            raise translate(exc, where, opening=True) from exc
        store = cls(pool, where, acquire_timeout, url)
        try:
            await store._run(postgres_schema.migrate, postgres_schema.MIGRATIONS)
        except BaseException:
            pool.terminate()
            raise
        logger.info("state database: %s", where)
        return store

    @property
    def where(self) -> str:
        """The database's URL, without its password."""
        return self._where

    async def _run(
        self,
        operation: Callable[Concatenate[Connection, P], Awaitable[T]],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """Run ``operation(connection, ...)`` on a connection of the pool."""
        for attempt in range(1, RETRIES + 1):
            if self._closed:
                raise StoreClosedError("the state store is closed")
            try:
                async with self._pool.acquire(timeout=self._acquire_timeout) as db:
                    return await operation(db, *args, **kwargs)
            except StoreError:
                raise
            except asyncpg.PostgresError as exc:
                if exc.sqlstate in RETRY_STATES and attempt < RETRIES:
                    continue  # rolled back whole: run it again
                raise self._failed(exc) from exc
            except (asyncpg.InterfaceError, OSError) as exc:  # TimeoutError is an OSError
                if self._closed:
                    raise StoreClosedError("the state store is closed") from exc
                raise self._failed(exc) from exc
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def _failed(self, exc: BaseException) -> StoreError:
        error = translate(exc, self._where)
        if isinstance(exc, asyncpg.PostgresError) and exc.sqlstate in CANNOT_WRITE:
            self._write_failure = message(exc)
        return error

    # --- lifecycle ---

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            # Lets the calls that hold a connection finish, within reason.
            await asyncio.wait_for(self._pool.close(), CLOSE_TIMEOUT)
        except TimeoutError:
            logger.warning("state database calls still running after %.0f s: cut", CLOSE_TIMEOUT)
            self._pool.terminate()

    @property
    def write_failure(self) -> str | None:
        return self._write_failure

    async def health(self) -> None:
        if self._write_failure is None:
            await self._run(postgres_schema.current_version)
            return
        now = self.clock()
        if self._probe_failure is not None and now - self._probed_at < PROBE_SPACING:
            raise StoreError(self._probe_failure)
        self._probed_at = now
        try:
            await self._run(postgres_schema.probe_write)
        except StoreError as exc:
            self._probe_failure = (
                f"the state database cannot be written ({exc.__cause__ or exc}):"
                " free space on its volume, or make it writable"
            )
            raise StoreError(self._probe_failure) from exc
        self._write_failure = None
        self._probe_failure = None

    async def schema_version(self) -> int:
        return await self._run(postgres_schema.current_version)

    # --- clusters ---

    async def add_cluster(
        self, name: str, now: datetime, rbac: str = "full", namespaces: tuple[str, ...] = ()
    ) -> Cluster:
        return await self._run(ops.add_cluster, name, now, rbac, namespaces)

    async def get_cluster(self, name: str) -> Cluster:
        return await self._run(ops.get_cluster, name)

    async def list_clusters(self) -> list[Cluster]:
        return await self._run(ops.list_clusters)

    async def delete_cluster(self, name: str, now: datetime | None = None) -> None:
        await self._run(ops.delete_cluster, name, datetime.now(UTC) if now is None else now)

    async def record_connection(
        self,
        name: str,
        agent_version: str | None,
        remote_addr: str | None,
        connected_since: datetime | None,
        last_seen: datetime,
    ) -> Cluster:
        return await self._run(
            ops.record_connection, name, agent_version, remote_addr, connected_since, last_seen
        )

    async def touch_cluster(self, name: str, last_seen: datetime) -> None:
        await self._run(ops.touch_cluster, name, last_seen)

    # --- bootstrap tokens ---

    async def add_bootstrap_token(
        self, token_hash: str, cluster: str, now: datetime, expires_at: datetime
    ) -> BootstrapToken:
        return await self._run(ops.add_bootstrap_token, token_hash, cluster, now, expires_at)

    async def consume_bootstrap_token(
        self, token_hash: str, cluster: str, now: datetime
    ) -> BootstrapToken:
        return await self._run(ops.consume_bootstrap_token, token_hash, cluster, now)

    # --- certificates ---

    async def record_certificate(
        self,
        serial: int,
        cluster: str,
        fingerprint: str,
        not_before: datetime,
        not_after: datetime,
    ) -> IssuedCertificate:
        return await self._run(
            ops.record_certificate, serial, cluster, fingerprint, not_before, not_after
        )

    async def get_certificate(self, serial: int) -> IssuedCertificate:
        return await self._run(ops.get_certificate, serial)

    async def revoked_serials(self) -> set[int]:
        return await self._run(ops.revoked_serials)

    async def revoke_cluster_certificates(self, cluster: str, now: datetime) -> int:
        return await self._run(ops.revoke_cluster_certificates, cluster, now)

    # --- users and API tokens ---

    async def add_user(
        self, name: str, groups: tuple[str, ...], is_admin: bool, now: datetime
    ) -> User:
        return await self._run(ops.add_user, name, groups, is_admin, now)

    async def get_user(self, name: str) -> User:
        return await self._run(ops.get_user, name)

    async def list_users(self) -> list[User]:
        return await self._run(ops.list_users)

    async def delete_user(self, name: str) -> None:
        await self._run(ops.delete_user, name)

    async def add_api_token(
        self, token_hash: str, user: str, now: datetime, expires_at: datetime | None = None
    ) -> ApiToken:
        return await self._run(ops.add_api_token, token_hash, user, now, expires_at)

    async def find_user_by_token(self, token_hash: str, now: datetime | None = None) -> User | None:
        return await self._run(ops.find_user_by_token, token_hash, now)

    async def list_api_tokens(self, user: str) -> list[ApiToken]:
        return await self._run(ops.list_api_tokens, user)

    async def revoke_api_tokens(self, user: str) -> int:
        return await self._run(ops.revoke_api_tokens, user)

    async def delete_api_token(self, token_hash: str) -> bool:
        return await self._run(ops.delete_api_token, token_hash)

    # --- grants ---

    async def set_grant(self, grant: Grant) -> None:
        await self._run(ops.set_grant, grant)

    async def get_grant(self, user: str, cluster: str) -> Grant:
        return await self._run(ops.get_grant, user, cluster)

    async def list_grants(self, user: str | None = None, cluster: str | None = None) -> list[Grant]:
        return await self._run(ops.list_grants, user, cluster)

    async def delete_grant(self, user: str, cluster: str) -> None:
        await self._run(ops.delete_grant, user, cluster)

    # --- audit ---

    async def add_audit(self, event: AuditEvent) -> AuditEvent:
        return await self._run(audit_ops.add_audit, event)

    async def add_audit_events(self, events: Sequence[AuditEvent]) -> int:
        return await self._run(audit_ops.add_audit_events, list(events))

    async def add_proxy_audit(self, records: Sequence[ProxyAuditRecord]) -> int:
        return await self._run(audit_ops.add_proxy_audit, list(records))

    async def list_audit(
        self,
        cluster: str | None = None,
        user: str | None = None,
        kind: AuditKind | None = None,
        since: datetime | None = None,
        limit: int = 100,
    ) -> list[AuditEvent]:
        return await self._run(audit_ops.list_audit, cluster, user, kind, since, limit)

    async def delete_audit_before(self, time: datetime, limit: int = PRUNE_BATCH) -> int:
        return await self._run(audit_ops.delete_audit_before, time, limit)

    # --- console ---

    async def add_console_session(self, session: ConsoleSession) -> None:
        await self._run(console_ops.add_console_session, session)

    async def get_console_session(self, session_hash: str, now: datetime) -> ConsoleSession | None:
        return await self._run(console_ops.get_console_session, session_hash, now)

    async def delete_console_session(self, session_hash: str) -> bool:
        return await self._run(console_ops.delete_console_session, session_hash)

    async def active_command_counts(self) -> dict[str, dict[str, int]]:
        return await self._run(console_ops.active_command_counts)

    async def search_audit(self, query: AuditQuery) -> list[AuditEvent]:
        return await self._run(console_ops.search_audit, query)

    # --- commands ---

    async def add_command(
        self, command: NewCommand, now: datetime, max_pending: int | None = None
    ) -> tuple[CommandRecord, bool]:
        return await self._run(cmd_ops.add_command, command, now, max_pending)

    async def get_command(self, command_id: str) -> CommandRecord:
        return await self._run(cmd_ops.get_command, command_id)

    async def list_commands(
        self,
        cluster: str | None = None,
        state: str | None = None,
        limit: int = 100,
        submitter: str | None = None,
    ) -> list[CommandRecord]:
        return await self._run(cmd_ops.list_commands, cluster, state, limit, submitter)

    async def pending_commands(self, cluster: str, limit: int = 100) -> list[CommandRecord]:
        return await self._run(cmd_ops.pending_commands, cluster, limit)

    async def mark_delivered(
        self, command_id: str, attempt: int, now: datetime, lease_until: datetime
    ) -> CommandRecord | None:
        return await self._run(cmd_ops.mark_delivered, command_id, attempt, now, lease_until)

    async def mark_running(
        self, command_id: str, attempt: int, now: datetime, lease_until: datetime
    ) -> CommandRecord | None:
        return await self._run(cmd_ops.mark_running, command_id, attempt, now, lease_until)

    async def extend_lease(self, command_id: str, attempt: int, lease_until: datetime) -> bool:
        return await self._run(cmd_ops.extend_lease, command_id, attempt, lease_until)

    async def finish_command(
        self,
        command_id: str,
        attempt: int,
        state: CommandState,
        result: dict[str, Any] | None,
        error: str | None,
        now: datetime,
    ) -> CommandRecord | None:
        return await self._run(
            cmd_ops.finish_command, command_id, attempt, state, result, error, now
        )

    async def withdraw_pending(
        self, command_id: str, reason: str, now: datetime
    ) -> CommandRecord | None:
        return await self._run(cmd_ops.withdraw_pending, command_id, reason, now)

    async def request_cancel(self, command_id: str, now: datetime) -> CommandRecord:
        return await self._run(cmd_ops.request_cancel, command_id, now)

    async def lapsed_lease_clusters(self, now: datetime) -> list[str]:
        return await self._run(cmd_ops.lapsed_lease_clusters, now)

    async def lapse_leases(
        self, now: datetime, heard: Mapping[str, datetime], absent_before: datetime | None
    ) -> list[LapsedLease]:
        return await self._run(cmd_ops.lapse_leases, now, dict(heard), absent_before)

    async def append_command_log(
        self, command_id: str, attempt: int, lines: Sequence[str], now: datetime, cap: int
    ) -> int:
        return await self._run(
            cmd_ops.append_command_log, command_id, attempt, list(lines), now, cap
        )

    async def count_commands(self, since: datetime) -> dict[str, int]:
        return await self._run(cmd_ops.count_commands, since)

    async def delete_finished_command_logs(self, before: datetime, limit: int = PRUNE_BATCH) -> int:
        return await self._run(cmd_ops.delete_finished_command_logs, before, limit)

    async def delete_finished_commands(self, before: datetime, limit: int = PRUNE_BATCH) -> int:
        return await self._run(cmd_ops.delete_finished_commands, before, limit)

    async def command_log(
        self, command_id: str, after: int = 0, limit: int = 1000
    ) -> list[CommandLogLine]:
        return await self._run(cmd_ops.command_log, command_id, after, limit)

    # --- replicas ---

    async def join_replica(
        self, name: str, address: str, version: str, now: datetime, lease_until: datetime
    ) -> int:
        return await self._run(replica_ops.join_replica, name, address, version, now, lease_until)

    async def leave_replica(self, name: str) -> None:
        await self._run(replica_ops.leave_replica, name)

    async def mark_draining(self, name: str) -> None:
        await self._run(replica_ops.mark_draining, name)

    async def claim_session(
        self, cluster: str, replica: str, now: datetime, lease_until: datetime
    ) -> tuple[int, str | None]:
        return await self._run(replica_ops.claim_session, cluster, replica, now, lease_until)

    async def release_session(self, cluster: str, replica: str, epoch: int) -> bool:
        return await self._run(replica_ops.release_session, cluster, replica, epoch)

    async def renew_sessions(
        self,
        replica: str,
        epochs: Mapping[str, int],
        agents: int,
        now: datetime,
        lease_until: datetime,
    ) -> set[str]:
        return await self._run(
            replica_ops.renew_sessions, replica, dict(epochs), agents, now, lease_until
        )

    async def session_owner(self, cluster: str, now: datetime) -> SessionOwner | None:
        return await self._run(replica_ops.session_owner, cluster, now)

    async def session_owners(self, now: datetime) -> dict[str, SessionOwner]:
        return await self._run(replica_ops.session_owners, now)

    async def list_replicas(self) -> list[ReplicaRecord]:
        return await self._run(replica_ops.list_replicas)

    def listen(
        self, on_event: Callable[[StoreEvent], None]
    ) -> contextlib.AbstractAsyncContextManager[None]:
        return listening(self._url, self._where, on_event)
