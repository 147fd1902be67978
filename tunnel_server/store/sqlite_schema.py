"""The SQLite schema, as an ordered list of migrations, and the code that applies them.

The database records in ``schema_version`` one row per migration applied.
Opening a database applies, each in its own transaction, the migrations it
lacks; a database newer than this code is refused. Later features add tables
by appending a :class:`Migration` to :data:`MIGRATIONS`; a released
migration is never edited.

Conventions of the schema:

- Times are TEXT in ISO 8601, always UTC and with microseconds
  (``2024-05-01T12:00:00.000000+00:00``). Having one fixed width, they sort
  and compare as text in the same order as in time.
- Certificate serial numbers are TEXT in lowercase hex without leading zeros:
  X.509 serials run to 160 bits, beyond SQLite's 64-bit integers.
- Lists of groups and audit details are JSON TEXT; booleans are 0 or 1.
- Token columns hold SHA-256 hex digests, never tokens.
- Audit rows name users and clusters without foreign keys, so the trail
  outlives them; certificates likewise, so revocations outlive their cluster.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

from tunnel_server.store.base import SchemaVersionError

__all__ = ["MIGRATIONS", "Migration", "current_version", "migrate", "transaction"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Migration:
    """One step of the schema: statements run in one transaction."""

    version: int
    description: str
    statements: tuple[str, ...]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        version=1,
        description="clusters, bootstrap tokens, certificates, users, API tokens, grants, audit",
        statements=(
            """
            CREATE TABLE clusters (
                name            TEXT PRIMARY KEY,
                created_at      TEXT NOT NULL,
                agent_version   TEXT,
                remote_addr     TEXT,
                connected_since TEXT,
                last_seen       TEXT,
                rbac            TEXT NOT NULL DEFAULT 'full'
            )
            """,
            """
            CREATE TABLE bootstrap_tokens (
                token_hash TEXT PRIMARY KEY,
                cluster    TEXT NOT NULL REFERENCES clusters (name) ON DELETE CASCADE,
                created_at TEXT NOT NULL,
                expires_at TEXT NOT NULL,
                used_at    TEXT
            )
            """,
            "CREATE INDEX bootstrap_tokens_cluster ON bootstrap_tokens (cluster)",
            """
            CREATE TABLE certificates (
                serial      TEXT PRIMARY KEY,
                cluster     TEXT NOT NULL,
                fingerprint TEXT NOT NULL,
                not_before  TEXT NOT NULL,
                not_after   TEXT NOT NULL,
                revoked_at  TEXT
            )
            """,
            "CREATE INDEX certificates_cluster ON certificates (cluster)",
            """
            CREATE INDEX certificates_revoked ON certificates (serial)
                WHERE revoked_at IS NOT NULL
            """,
            """
            CREATE TABLE users (
                name       TEXT PRIMARY KEY,
                groups     TEXT NOT NULL,
                is_admin   INTEGER NOT NULL CHECK (is_admin IN (0, 1)),
                created_at TEXT NOT NULL
            )
            """,
            """
            CREATE TABLE api_tokens (
                token_hash   TEXT PRIMARY KEY,
                user_name    TEXT NOT NULL REFERENCES users (name) ON DELETE CASCADE,
                created_at   TEXT NOT NULL,
                last_used_at TEXT
            )
            """,
            "CREATE INDEX api_tokens_user ON api_tokens (user_name)",
            """
            CREATE TABLE grants (
                user_name   TEXT NOT NULL REFERENCES users (name) ON DELETE CASCADE,
                cluster     TEXT NOT NULL REFERENCES clusters (name) ON DELETE CASCADE,
                as_groups   TEXT NOT NULL,
                commands    INTEGER NOT NULL CHECK (commands IN (0, 1)),
                impersonate INTEGER NOT NULL CHECK (impersonate IN (0, 1)),
                PRIMARY KEY (user_name, cluster)
            )
            """,
            "CREATE INDEX grants_cluster ON grants (cluster)",
            # AUTOINCREMENT so that ids of pruned events are never handed out again.
            """
            CREATE TABLE audit (
                id          INTEGER PRIMARY KEY AUTOINCREMENT,
                time        TEXT NOT NULL,
                user_name   TEXT,
                cluster     TEXT,
                kind        TEXT NOT NULL CHECK (kind IN ('proxy', 'command', 'admin')),
                verb        TEXT NOT NULL,
                path        TEXT,
                status      INTEGER,
                bytes_in    INTEGER NOT NULL,
                bytes_out   INTEGER NOT NULL,
                duration_ms INTEGER NOT NULL,
                detail      TEXT NOT NULL
            )
            """,
            "CREATE INDEX audit_time ON audit (time, id)",
            "CREATE INDEX audit_cluster_time ON audit (cluster, time, id)",
            "CREATE INDEX audit_user_time ON audit (user_name, time, id)",
        ),
    ),
    Migration(
        version=2,
        description="the command queue and command logs",
        statements=(
            """
            CREATE TABLE commands (
                id               TEXT PRIMARY KEY,
                cluster          TEXT NOT NULL,
                submitter        TEXT NOT NULL,
                type             TEXT NOT NULL,
                name             TEXT NOT NULL,
                spec             TEXT NOT NULL,
                state            TEXT NOT NULL,
                attempt          INTEGER NOT NULL,
                max_attempts     INTEGER NOT NULL,
                timeout_seconds  REAL NOT NULL,
                idempotency_key  TEXT,
                created_at       TEXT NOT NULL,
                updated_at       TEXT NOT NULL,
                delivered_at     TEXT,
                started_at       TEXT,
                finished_at      TEXT,
                lease_expires_at TEXT,
                cancel_requested INTEGER NOT NULL DEFAULT 0,
                result           TEXT,
                error            TEXT,
                log_bytes        INTEGER NOT NULL DEFAULT 0,
                log_truncated    INTEGER NOT NULL DEFAULT 0
            )
            """,
            "CREATE INDEX commands_cluster_state ON commands (cluster, state, created_at)",
            "CREATE INDEX commands_created ON commands (created_at)",
            "CREATE INDEX commands_lease ON commands (state, lease_expires_at)",
            """
            CREATE UNIQUE INDEX commands_idempotency
                ON commands (cluster, idempotency_key) WHERE idempotency_key IS NOT NULL
            """,
            """
            CREATE TABLE command_logs (
                seq        INTEGER PRIMARY KEY AUTOINCREMENT,
                command_id TEXT NOT NULL REFERENCES commands (id) ON DELETE CASCADE,
                attempt    INTEGER NOT NULL,
                time       TEXT NOT NULL,
                text       TEXT NOT NULL
            )
            """,
            "CREATE INDEX command_logs_command ON command_logs (command_id, seq)",
        ),
    ),
    Migration(
        version=3,
        description="the namespaces of namespaced clusters",
        statements=("ALTER TABLE clusters ADD COLUMN namespaces TEXT NOT NULL DEFAULT '[]'",),
    ),
    Migration(
        version=4,
        description="API tokens that expire",
        # NULL: the token never expires (every token made before this version).
        statements=("ALTER TABLE api_tokens ADD COLUMN expires_at TEXT",),
    ),
    Migration(
        version=5,
        description="finished commands found by when they finished (their retention)",
        statements=(
            "CREATE INDEX commands_finished ON commands (finished_at)"
            " WHERE finished_at IS NOT NULL",
        ),
    ),
    Migration(
        version=6,
        description="a table the readiness probe writes to",
        statements=("CREATE TABLE write_probe (id INTEGER PRIMARY KEY, data BLOB NOT NULL)",),
    ),
    Migration(
        version=7,
        description="idempotency keys of their own for each submitter",
        statements=(
            "DROP INDEX commands_idempotency",
            "CREATE UNIQUE INDEX commands_idempotency ON commands"
            " (cluster, submitter, idempotency_key) WHERE idempotency_key IS NOT NULL",
        ),
    ),
    Migration(
        version=8,
        description="whom an impersonate grant allows (empty: anyone under tunnel:)",
        statements=(
            "ALTER TABLE grants ADD COLUMN impersonate_targets TEXT NOT NULL DEFAULT '[]'",
        ),
    ),
    Migration(
        version=9,
        description="grants whose user's commands act as the agent (--commands-as-agent)",
        statements=("ALTER TABLE grants ADD COLUMN commands_as_agent INTEGER NOT NULL DEFAULT 0",),
    ),
    Migration(
        version=10,
        description="the web console's sign-in sessions (hashed ids), and audit by verb",
        statements=(
            # A session goes with the token it was signed in with (revoked, expired, its
            # user deleted): tunnel_server/store/console.py.
            """
            CREATE TABLE console_sessions (
                session_hash TEXT PRIMARY KEY,
                user_name    TEXT NOT NULL REFERENCES users (name) ON DELETE CASCADE,
                token_hash   TEXT NOT NULL REFERENCES api_tokens (token_hash) ON DELETE CASCADE,
                created_at   TEXT NOT NULL,
                expires_at   TEXT NOT NULL
            )
            """,
            "CREATE INDEX console_sessions_expiry ON console_sessions (expires_at)",
            "CREATE INDEX console_sessions_token ON console_sessions (token_hash)",
            "CREATE INDEX audit_verb_time ON audit (verb, time, id)",
        ),
    ),
)
"""Every migration, in order; ``MIGRATIONS[i].version == i + 1``."""


@contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[None]:
    """Run the block in one write transaction, committed unless it raises.

    ``BEGIN IMMEDIATE`` takes the write lock at the start, so that what the
    block reads cannot change under it, even from another process.
    The connection must be in autocommit mode (``isolation_level=None``).
    Inside a transaction already (a batch, see ``sqlite_worker``), the block
    runs in a savepoint: undone alone if it raises, committed with the batch.
    """
    # On a failure, SQLite may have rolled back the transaction itself (disk
    # full, an I/O error): then there is nothing left to undo, and the
    # original error, not "no transaction is active", must reach the caller.
    if db.in_transaction:
        db.execute("SAVEPOINT block")
        try:
            yield
        except BaseException:
            if _still_open(db):
                db.execute("ROLLBACK TO block")
                db.execute("RELEASE block")
            raise
        db.execute("RELEASE block")
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if _still_open(db):
            db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _still_open(db: sqlite3.Connection) -> bool:
    """Whether ``db`` is in a transaction (after a failure SQLite may have ended it)."""
    return db.in_transaction


#: Bytes the write probe stores: a page of their own, as a new row may need.
PROBE_BYTES = 4096


def probe_write(db: sqlite3.Connection) -> None:
    """Store a row of :data:`PROBE_BYTES` and delete it, in one committed transaction.

    Raises what SQLite raises when the database cannot take a new row (disk
    full, an I/O error, a read-only file); a probe that returns has committed.
    """
    with transaction(db):
        db.execute("INSERT INTO write_probe (data) VALUES (zeroblob(?))", (PROBE_BYTES,))
        db.execute("DELETE FROM write_probe")


def current_version(db: sqlite3.Connection) -> int:
    """The number of the last migration applied to ``db`` (0 for a new database)."""
    row = db.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()
    return int(row[0])


def migrate(db: sqlite3.Connection, migrations: Sequence[Migration] = MIGRATIONS) -> int:
    """Apply to ``db`` the migrations it lacks; return its version afterwards.

    Safe to run on every open, and by several processes at once: each
    migration is applied in a transaction that first checks it is still due.
    """
    for index, migration in enumerate(migrations):
        if migration.version != index + 1:
            raise SchemaVersionError(
                f"migration {migration.version} is out of order (expected {index + 1})"
            )
    db.execute(
        """
        CREATE TABLE IF NOT EXISTS schema_version (
            version     INTEGER PRIMARY KEY,
            description TEXT NOT NULL,
            applied_at  TEXT NOT NULL
        )
        """
    )
    version = current_version(db)
    if version > len(migrations):
        raise SchemaVersionError(
            f"the state database is at schema version {version}, newer than this server "
            f"knows ({len(migrations)}); upgrade the server or use a backup of the database"
        )
    for migration in migrations[version:]:
        if _apply(db, migration):
            logger.info(
                "state database migrated to version %d: %s",
                migration.version,
                migration.description,
            )
    return current_version(db)


def _apply(db: sqlite3.Connection, migration: Migration) -> bool:
    """Apply one migration unless it is applied already; say whether it was."""
    with transaction(db):
        if current_version(db) >= migration.version:
            return False  # another process applied it while this one waited
        for statement in migration.statements:
            db.execute(statement)
        db.execute(
            "INSERT INTO schema_version (version, description, applied_at) VALUES (?, ?, ?)",
            (
                migration.version,
                migration.description,
                datetime.now(UTC).isoformat(timespec="microseconds"),
            ),
        )
    return True
