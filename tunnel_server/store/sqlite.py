"""The embedded store: one SQLite file, for a server that runs as one replica.

One dedicated worker thread owns the connection and does all database work
(the functions of ``sqlite_ops`` and ``sqlite_audit``), so the event loop never
waits on the disk; calls queue on it in order and run in batches, one
transaction per batch (``sqlite_worker``). The file is created readable by its owner alone
(it holds token hashes) and runs in WAL mode with ``synchronous=NORMAL``: a
power cut may lose the last transactions, never consistency. sqlite3's
exceptions are translated into the store's errors here, at the thread's edge.
Schema and conventions: ``sqlite_schema``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import stat
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, Concatenate, ParamSpec, TypeVar

from tunnel_server.store import sqlite_audit as audit_ops
from tunnel_server.store import sqlite_commands as cmd_ops
from tunnel_server.store import sqlite_console as console_ops
from tunnel_server.store import sqlite_ops as ops
from tunnel_server.store import sqlite_schema
from tunnel_server.store.base import (
    AlreadyExistsError,
    ApiToken,
    AuditEvent,
    AuditKind,
    BootstrapToken,
    Cluster,
    Grant,
    InvalidValueError,
    IssuedCertificate,
    NotFoundError,
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
from tunnel_server.store.sqlite_worker import DatabaseWorker

__all__ = ["THREAD_NICENESS", "SqliteStore"]

logger = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

DEFAULT_BUSY_TIMEOUT = 5.0
"""Seconds a statement waits for a lock held by another process before failing."""
PROBE_SPACING = 1.0
"""Seconds between probe writes of a store that cannot write (``health``): /readyz
answers anyone who asks, and each asking would otherwise write."""
THREAD_NICENESS = 10
"""How much lower the database thread's CPU priority is than the process's (nice
values: 10 weighs about a tenth of 0 when both want a core)."""


class SqliteStore(Store):
    """A :class:`Store` in one SQLite file. Create it with :meth:`open`."""

    def __init__(
        self, path: str, executor: ThreadPoolExecutor, connection: sqlite3.Connection
    ) -> None:
        """Use :meth:`open`; this adopts a connection made on ``executor``'s thread."""
        self._path = path
        self._executor = executor
        self._worker = DatabaseWorker(executor, connection, _translate)
        self._db = connection  # touched only on the executor's thread
        self._closed = False
        #: When a failing store was last probed (on ``clock``), and why the probe failed.
        self.clock: Callable[[], float] = time.monotonic
        self._probed_at = float("-inf")
        self._probe_failure: str | None = None

    @classmethod
    async def open(
        cls, path: str | os.PathLike[str], *, busy_timeout: float = DEFAULT_BUSY_TIMEOUT
    ) -> SqliteStore:
        """Open the database at ``path``, creating it (mode 0600) and migrating it as needed."""
        path = os.fspath(path)
        executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="sqlite-store", initializer=_yield_to_event_loop
        )
        opening = executor.submit(_connect, path, busy_timeout)
        try:
            connection = await asyncio.wrap_future(opening)
        except BaseException:
            # Failed or cancelled: close what may yet open, on the thread that owns it.
            executor.submit(_discard, opening)
            executor.shutdown(wait=False)
            raise
        return cls(path, executor, connection)

    @property
    def path(self) -> str:
        """The database file."""
        return self._path

    async def _run(
        self,
        operation: Callable[Concatenate[sqlite3.Connection, P], T],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """Run ``operation(connection, ...)`` on the database thread (see ``sqlite_worker``)."""
        if self._closed:
            raise StoreClosedError("the state store is closed")

        def call(db: sqlite3.Connection) -> T:
            return operation(db, *args, **kwargs)

        return await self._worker.submit(call)

    # --- lifecycle ---

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        try:
            # Queued behind the batches already scheduled, which therefore complete first.
            await loop.run_in_executor(self._executor, _close, self._db)
        finally:
            self._executor.shutdown(wait=False)

    @property
    def write_failure(self) -> str | None:
        return self._worker.write_failure

    async def health(self) -> None:
        if self._worker.write_failure is None:
            await self._run(sqlite_schema.current_version)
            return
        # A write failed: see whether one that needs room of its own would now,
        # at most once per PROBE_SPACING (/readyz answers anyone who asks).
        now = self.clock()
        if self._probe_failure is not None and now - self._probed_at < PROBE_SPACING:
            raise StoreError(self._probe_failure)
        self._probed_at = now
        worker = self._worker

        def probe(db: sqlite3.Connection) -> None:
            sqlite_schema.probe_write(db)
            # On the database thread: a batch whose COMMIT fails after this sets it again.
            worker.write_failure = None

        try:
            await self._run(probe)
        except StoreError as exc:
            self._probe_failure = (
                f"the state database cannot be written ({exc.__cause__ or exc}):"
                " free space on its volume, or make it writable"
            )
            raise StoreError(self._probe_failure) from exc
        self._probe_failure = None

    async def schema_version(self) -> int:
        return await self._run(sqlite_schema.current_version)

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


# --- Helpers that run on the database thread -----------------------------------


MIN_SQLITE = (3, 35, 0)
"""The oldest SQLite with ``RETURNING``, which the command queue's updates use."""


def _yield_to_event_loop() -> None:
    """Lower the calling thread's CPU priority (by :data:`THREAD_NICENESS`), on Linux.

    The database thread's work comes in bursts: a batch of audit events every
    50 ms writes a row and three index entries each. A thread that slept that
    long preempts whatever runs when it wakes, and on a busy machine that is
    a request on its way through the proxy: at concurrency 1 the bursts put
    half a millisecond on the p99 of every proxied request (docs/benchmarks.md,
    "The database thread's bursts"). Niced, the thread takes the cores when
    the request path leaves them, and still has a share of them when it does
    not: a proxied request waits on it only for an access-cache miss, or when
    the audit queue is full.

    Linux gives each thread its own nice value; elsewhere the call would
    change the whole process's, so it is made on Linux only.
    """
    if sys.platform != "linux":
        return
    thread = threading.get_native_id()
    try:
        niceness = os.getpriority(os.PRIO_PROCESS, thread)
        os.setpriority(os.PRIO_PROCESS, thread, min(19, niceness + THREAD_NICENESS))
    except OSError as exc:  # a seccomp profile may refuse it: run at the usual priority
        logger.info("cannot lower the database thread's priority: %s", exc)


def _connect(path: str, busy_timeout: float) -> sqlite3.Connection:
    """Open, configure and migrate the database at ``path``."""
    if sqlite3.sqlite_version_info < MIN_SQLITE:
        raise StoreError(
            f"SQLite {sqlite3.sqlite_version} is too old for the state database;"
            f" the server needs {'.'.join(map(str, MIN_SQLITE))} or later"
        )
    try:
        _create_private(path)
        db = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None)
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(f"cannot open the state database {path}: {_reason(exc)}") from exc
    try:
        db.row_factory = sqlite3.Row
        db.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode != "wal":
            raise StoreError(
                f"the state database {path} cannot use WAL mode (it stays in {mode!r});"
                " put it on a local file system"
            )
        db.execute("PRAGMA synchronous = NORMAL")
        db.execute("PRAGMA foreign_keys = ON")
        sqlite_schema.migrate(db, sqlite_schema.MIGRATIONS)
    except sqlite3.Error as exc:
        db.close()
        raise StoreError(f"cannot open the state database {path}: {_reason(exc)}") from exc
    except BaseException:
        db.close()
        raise
    return db


def _create_private(path: str) -> None:
    """Create the file at ``path`` readable by its owner alone, unless it exists."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        mode = stat.S_IMODE(os.stat(path).st_mode)
        if mode & 0o077:
            logger.warning(
                "the state database %s holds token hashes but others may read it"
                " (mode %o); run chmod 600 on it",
                path,
                mode,
            )
        return
    os.close(fd)


def _discard(opening: Future[sqlite3.Connection]) -> None:
    """Close the connection ``opening`` made, if it made one (``open`` was abandoned)."""
    if not opening.cancelled() and opening.exception() is None:
        opening.result().close()


def _close(db: sqlite3.Connection) -> None:
    try:
        db.close()
    except sqlite3.Error as exc:
        raise _translate(exc) from exc


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def _translate(exc: sqlite3.Error) -> StoreError:
    """The StoreError for a sqlite3 error that the operation did not foresee."""
    name = getattr(exc, "sqlite_errorname", "")
    if name in ("SQLITE_CONSTRAINT_PRIMARYKEY", "SQLITE_CONSTRAINT_UNIQUE"):
        return AlreadyExistsError("a record with this key exists already")
    if name == "SQLITE_CONSTRAINT_FOREIGNKEY":
        return NotFoundError("the user or cluster referred to does not exist")
    if isinstance(exc, sqlite3.IntegrityError):
        return InvalidValueError(f"the state database refused a value: {exc}")
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return StoreError("the state database is locked by another process; retry later")
    return StoreError(f"the state database failed: {_reason(exc)}")
