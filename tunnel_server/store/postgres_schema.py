"""The PostgreSQL schema, as an ordered list of migrations, and the code that applies them.

Like ``sqlite_schema``: ``schema_version`` holds one row per migration
applied; opening a database applies, each in its own transaction, the
migrations it lacks, and refuses a database newer than this code. Migrations
are forward-only; a released one is never edited. Several replicas may open
one database at once: a transaction-scoped advisory lock makes them migrate
one after the other, and each migration checks, under that lock, that it is
still due.

The tables and constraints are SQLite's (``sqlite_schema``), in PostgreSQL's
types:

- Times are ``TIMESTAMPTZ`` (microseconds, UTC on the way out).
- Certificate serial numbers are ``NUMERIC(49, 0)``: X.509 serials run to 160
  bits, beyond ``BIGINT``.
- Lists of groups and namespaces are ``TEXT[]``; audit details, command specs
  and results are ``JSONB``; booleans are ``BOOLEAN``.
- Audit ids and log line numbers are ``BIGINT`` identities: a sequence never
  hands out a pruned id again.
- Token columns hold SHA-256 hex digests, never tokens.
- Audit rows name users and clusters without foreign keys, so the trail
  outlives them; certificates likewise, so revocations outlive their cluster.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

from asyncpg import Record
from asyncpg.pool import PoolConnectionProxy

from tunnel_server.store.base import SchemaVersionError

__all__ = [
    "EVENTS_CHANNEL",
    "MIGRATIONS",
    "Connection",
    "Migration",
    "current_version",
    "migrate",
    "probe_write",
]

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    Connection: TypeAlias = PoolConnectionProxy[Record]
else:  # generic only in asyncpg's type stubs
    Connection: TypeAlias = PoolConnectionProxy
"""A connection lent by the store's pool."""

#: The key of the advisory lock that migrations hold (any constant of the project's own).
MIGRATION_LOCK = 0x7475_6E6E_656C  # "tunnel"
#: Seconds a migration's statement may take (or wait for another replica's migration):
#: far beyond the store's statement timeout, which is made for requests, not for
#: building an index on a table of a year's audit trail.
MIGRATION_TIMEOUT = 3600.0


@dataclass(frozen=True, slots=True)
class Migration:
    """One step of the schema: statements run in one transaction."""

    version: int
    description: str
    statements: tuple[str, ...]


#: The channel on which the database announces changes other replicas must hear of
#: (``tunnel_server.store.replicas.StoreEvent``), as JSON objects.
EVENTS_CHANNEL = "tunnel_events"

REPLICA_STATEMENTS: tuple[str, ...] = (
    """
    CREATE TABLE replicas (
        name         TEXT PRIMARY KEY,
        address      TEXT NOT NULL,
        version      TEXT NOT NULL,
        started_at   TIMESTAMPTZ NOT NULL,
        heartbeat_at TIMESTAMPTZ NOT NULL,
        lease_until  TIMESTAMPTZ NOT NULL,
        agents       INTEGER NOT NULL DEFAULT 0,
        draining     BOOLEAN NOT NULL DEFAULT false
    )
    """,
    # Epochs come from one sequence: a newer claim always has the greater one.
    "CREATE SEQUENCE agent_session_epochs",
    """
    CREATE TABLE agent_sessions (
        cluster     TEXT PRIMARY KEY REFERENCES clusters (name) ON DELETE CASCADE,
        replica     TEXT NOT NULL,
        epoch       BIGINT NOT NULL,
        claimed_at  TIMESTAMPTZ NOT NULL,
        lease_until TIMESTAMPTZ NOT NULL
    )
    """,
    "CREATE INDEX agent_sessions_replica ON agent_sessions (replica)",
    # Each trigger announces one kind of change; pg_notify sends on commit only.
    f"""
    CREATE FUNCTION tunnel_notify(payload jsonb) RETURNS void LANGUAGE sql AS
        $$ SELECT pg_notify('{EVENTS_CHANNEL}', payload::text) $$
    """,
    """
    CREATE FUNCTION tunnel_user_changed() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM tunnel_notify(jsonb_build_object('kind', 'access', 'user', OLD.name));
        RETURN NULL;
    END $$
    """,
    """
    CREATE TRIGGER users_changed AFTER UPDATE OR DELETE ON users
        FOR EACH ROW EXECUTE FUNCTION tunnel_user_changed()
    """,
    """
    CREATE FUNCTION tunnel_token_changed() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM tunnel_notify(jsonb_build_object('kind', 'access', 'user', OLD.user_name));
        RETURN NULL;
    END $$
    """,
    # Not on last_used_at: a token in use touches its row now and then.
    """
    CREATE TRIGGER api_tokens_changed AFTER DELETE OR UPDATE OF expires_at ON api_tokens
        FOR EACH ROW EXECUTE FUNCTION tunnel_token_changed()
    """,
    """
    CREATE FUNCTION tunnel_grant_changed() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'DELETE' THEN
            PERFORM tunnel_notify(jsonb_build_object(
                'kind', 'access', 'user', OLD.user_name, 'cluster', OLD.cluster));
        ELSE
            PERFORM tunnel_notify(jsonb_build_object(
                'kind', 'access', 'user', NEW.user_name, 'cluster', NEW.cluster));
        END IF;
        RETURN NULL;
    END $$
    """,
    """
    CREATE TRIGGER grants_changed AFTER INSERT OR UPDATE OR DELETE ON grants
        FOR EACH ROW EXECUTE FUNCTION tunnel_grant_changed()
    """,
    """
    CREATE FUNCTION tunnel_certificate_revoked() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM tunnel_notify(jsonb_build_object('kind', 'revoked', 'cluster', NEW.cluster));
        RETURN NULL;
    END $$
    """,
    """
    CREATE TRIGGER certificates_revoked AFTER UPDATE OF revoked_at ON certificates
        FOR EACH ROW WHEN (NEW.revoked_at IS NOT NULL AND OLD.revoked_at IS NULL)
        EXECUTE FUNCTION tunnel_certificate_revoked()
    """,
    """
    CREATE FUNCTION tunnel_cluster_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM tunnel_notify(jsonb_build_object('kind', 'cluster', 'cluster', OLD.name));
        RETURN NULL;
    END $$
    """,
    """
    CREATE TRIGGER clusters_deleted AFTER DELETE ON clusters
        FOR EACH ROW EXECUTE FUNCTION tunnel_cluster_deleted()
    """,
    """
    CREATE FUNCTION tunnel_command_changed() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM tunnel_notify(jsonb_build_object(
            'kind', 'command', 'cluster', NEW.cluster, 'id', NEW.id, 'state', NEW.state,
            'cancel', NEW.cancel_requested));
        RETURN NULL;
    END $$
    """,
    """
    CREATE TRIGGER commands_added AFTER INSERT ON commands
        FOR EACH ROW EXECUTE FUNCTION tunnel_command_changed()
    """,
    # A change of state, a cancellation asked for, or a log that grew (followers wake).
    """
    CREATE TRIGGER commands_changed AFTER UPDATE ON commands
        FOR EACH ROW WHEN (
            OLD.state IS DISTINCT FROM NEW.state
            OR OLD.cancel_requested IS DISTINCT FROM NEW.cancel_requested
            OR OLD.log_bytes IS DISTINCT FROM NEW.log_bytes
        )
        EXECUTE FUNCTION tunnel_command_changed()
    """,
    """
    CREATE FUNCTION tunnel_session_claimed() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM tunnel_notify(jsonb_build_object(
            'kind', 'session', 'cluster', NEW.cluster, 'replica', NEW.replica,
            'epoch', NEW.epoch));
        RETURN NULL;
    END $$
    """,
    """
    CREATE TRIGGER agent_sessions_claimed AFTER INSERT OR UPDATE OF epoch ON agent_sessions
        FOR EACH ROW EXECUTE FUNCTION tunnel_session_claimed()
    """,
)
"""Migration 6: replicas and the sessions they hold (``postgres_replicas``), and the
triggers that announce changes on :data:`EVENTS_CHANNEL`."""


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        version=1,
        description="clusters, bootstrap tokens, certificates, users, API tokens, grants, audit",
        statements=(
            """
            CREATE TABLE clusters (
                name            TEXT PRIMARY KEY,
                created_at      TIMESTAMPTZ NOT NULL,
                agent_version   TEXT,
                remote_addr     TEXT,
                connected_since TIMESTAMPTZ,
                last_seen       TIMESTAMPTZ,
                rbac            TEXT NOT NULL DEFAULT 'full',
                namespaces      TEXT[] NOT NULL DEFAULT '{}'
            )
            """,
            """
            CREATE TABLE bootstrap_tokens (
                token_hash TEXT PRIMARY KEY,
                cluster    TEXT NOT NULL REFERENCES clusters (name) ON DELETE CASCADE,
                created_at TIMESTAMPTZ NOT NULL,
                expires_at TIMESTAMPTZ NOT NULL,
                used_at    TIMESTAMPTZ
            )
            """,
            "CREATE INDEX bootstrap_tokens_cluster ON bootstrap_tokens (cluster)",
            """
            CREATE TABLE certificates (
                serial      NUMERIC(49, 0) PRIMARY KEY CHECK (serial >= 0),
                cluster     TEXT NOT NULL,
                fingerprint TEXT NOT NULL,
                not_before  TIMESTAMPTZ NOT NULL,
                not_after   TIMESTAMPTZ NOT NULL,
                revoked_at  TIMESTAMPTZ
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
                groups     TEXT[] NOT NULL,
                is_admin   BOOLEAN NOT NULL,
                created_at TIMESTAMPTZ NOT NULL
            )
            """,
            """
            CREATE TABLE api_tokens (
                token_hash   TEXT PRIMARY KEY,
                user_name    TEXT NOT NULL REFERENCES users (name) ON DELETE CASCADE,
                created_at   TIMESTAMPTZ NOT NULL,
                last_used_at TIMESTAMPTZ,
                expires_at   TIMESTAMPTZ
            )
            """,
            "CREATE INDEX api_tokens_user ON api_tokens (user_name)",
            """
            CREATE INDEX api_tokens_expires ON api_tokens (expires_at)
                WHERE expires_at IS NOT NULL
            """,
            """
            CREATE TABLE grants (
                user_name           TEXT NOT NULL REFERENCES users (name) ON DELETE CASCADE,
                cluster             TEXT NOT NULL REFERENCES clusters (name) ON DELETE CASCADE,
                as_groups           TEXT[] NOT NULL,
                commands            BOOLEAN NOT NULL,
                impersonate         BOOLEAN NOT NULL,
                impersonate_targets TEXT[] NOT NULL DEFAULT '{}',
                PRIMARY KEY (user_name, cluster)
            )
            """,
            "CREATE INDEX grants_cluster ON grants (cluster)",
            """
            CREATE TABLE audit (
                id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                time        TIMESTAMPTZ NOT NULL,
                user_name   TEXT,
                cluster     TEXT,
                kind        TEXT NOT NULL CHECK (kind IN ('proxy', 'command', 'admin')),
                verb        TEXT NOT NULL,
                path        TEXT,
                status      INTEGER,
                bytes_in    BIGINT NOT NULL,
                bytes_out   BIGINT NOT NULL,
                duration_ms BIGINT NOT NULL,
                detail      JSONB NOT NULL
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
                spec             JSONB NOT NULL,
                state            TEXT NOT NULL CHECK (state IN ('pending', 'delivered',
                                     'running', 'succeeded', 'failed', 'cancelled',
                                     'timed_out', 'lost')),
                attempt          INTEGER NOT NULL,
                max_attempts     INTEGER NOT NULL,
                timeout_seconds  DOUBLE PRECISION NOT NULL,
                idempotency_key  TEXT,
                created_at       TIMESTAMPTZ NOT NULL,
                updated_at       TIMESTAMPTZ NOT NULL,
                delivered_at     TIMESTAMPTZ,
                started_at       TIMESTAMPTZ,
                finished_at      TIMESTAMPTZ,
                lease_expires_at TIMESTAMPTZ,
                cancel_requested BOOLEAN NOT NULL DEFAULT false,
                result           JSONB,
                error            TEXT,
                log_bytes        BIGINT NOT NULL DEFAULT 0,
                log_truncated    BOOLEAN NOT NULL DEFAULT false
            )
            """,
            "CREATE INDEX commands_cluster_state ON commands (cluster, state, created_at)",
            "CREATE INDEX commands_created ON commands (created_at)",
            "CREATE INDEX commands_lease ON commands (state, lease_expires_at)",
            """
            CREATE INDEX commands_finished ON commands (finished_at)
                WHERE finished_at IS NOT NULL
            """,
            # Each submitter has idempotency keys of their own (sqlite_schema, version 7).
            """
            CREATE UNIQUE INDEX commands_idempotency
                ON commands (cluster, submitter, idempotency_key)
                WHERE idempotency_key IS NOT NULL
            """,
            """
            CREATE TABLE command_logs (
                seq        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                command_id TEXT NOT NULL REFERENCES commands (id) ON DELETE CASCADE,
                attempt    INTEGER NOT NULL,
                time       TIMESTAMPTZ NOT NULL,
                text       TEXT NOT NULL
            )
            """,
            "CREATE INDEX command_logs_command ON command_logs (command_id, seq)",
        ),
    ),
    Migration(
        version=3,
        description="a table the readiness probe writes to",
        statements=(
            "CREATE TABLE write_probe"
            " (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, data BYTEA NOT NULL)",
        ),
    ),
    Migration(
        version=4,
        description="grants whose user's commands act as the agent (--commands-as-agent)",
        statements=(
            "ALTER TABLE grants ADD COLUMN commands_as_agent BOOLEAN NOT NULL DEFAULT FALSE",
        ),
    ),
    Migration(
        version=5,
        description="the web console's sign-in sessions (hashed ids), and audit by verb",
        statements=(
            # A session goes with the token it was signed in with (revoked, expired, its
            # user deleted): tunnel_server/store/console.py.
            """
            CREATE TABLE console_sessions (
                session_hash TEXT PRIMARY KEY,
                user_name    TEXT NOT NULL REFERENCES users (name) ON DELETE CASCADE,
                token_hash   TEXT NOT NULL REFERENCES api_tokens (token_hash) ON DELETE CASCADE,
                created_at   TIMESTAMPTZ NOT NULL,
                expires_at   TIMESTAMPTZ NOT NULL
            )
            """,
            "CREATE INDEX console_sessions_expiry ON console_sessions (expires_at)",
            "CREATE INDEX console_sessions_token ON console_sessions (token_hash)",
            "CREATE INDEX audit_verb_time ON audit (verb, time, id)",
        ),
    ),
    Migration(
        version=6,
        description="replicas, the agent session each holds, and change notifications",
        statements=REPLICA_STATEMENTS,
    ),
)
"""Every migration, in order; ``MIGRATIONS[i].version == i + 1``."""

_CREATE_VERSION_TABLE = """
    CREATE TABLE IF NOT EXISTS schema_version (
        version     INTEGER PRIMARY KEY,
        description TEXT NOT NULL,
        applied_at  TIMESTAMPTZ NOT NULL DEFAULT now()
    )
"""

#: Bytes the write probe stores: as a new row of some size would need.
PROBE_BYTES = 4096


async def probe_write(db: Connection) -> None:
    """Store a row of :data:`PROBE_BYTES` and delete it, in one committed transaction."""
    async with db.transaction():
        await db.execute("INSERT INTO write_probe (data) VALUES ($1)", bytes(PROBE_BYTES))
        await db.execute("DELETE FROM write_probe")


async def current_version(db: Connection) -> int:
    """The number of the last migration applied to ``db`` (0 for a new database)."""
    if await db.fetchval("SELECT to_regclass('schema_version')") is None:
        return 0
    version = await db.fetchval("SELECT coalesce(max(version), 0) FROM schema_version")
    return int(version)


async def migrate(db: Connection, migrations: Sequence[Migration] = MIGRATIONS) -> int:
    """Apply to ``db`` the migrations it lacks; return its version afterwards.

    Safe to run on every open, and by several replicas at once.
    """
    for index, migration in enumerate(migrations):
        if migration.version != index + 1:
            raise SchemaVersionError(
                f"migration {migration.version} is out of order (expected {index + 1})"
            )
    async with db.transaction():
        await _lock(db)
        await db.execute(_CREATE_VERSION_TABLE)
    version = await _check(db, migrations)
    for migration in migrations[version:]:
        if await _apply(db, migration):
            logger.info(
                "state database migrated to version %d: %s",
                migration.version,
                migration.description,
            )
    return await _check(db, migrations)


async def _lock(db: Connection) -> None:
    """Take the migration lock for the transaction, and lift its statement timeout.

    Replicas that open one database together migrate it one at a time: the others
    wait here, however long the migration takes.
    """
    await db.execute("SET LOCAL statement_timeout = 0")
    await db.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK, timeout=MIGRATION_TIMEOUT)


async def _check(db: Connection, migrations: Sequence[Migration]) -> int:
    version = await current_version(db)
    if version > len(migrations):
        raise SchemaVersionError(
            f"the state database is at schema version {version}, newer than this server "
            f"knows ({len(migrations)}); upgrade the server or use a backup of the database"
        )
    return version


async def _apply(db: Connection, migration: Migration) -> bool:
    """Apply one migration unless it is applied already; say whether it was."""
    async with db.transaction():
        await _lock(db)
        if await current_version(db) >= migration.version:
            return False  # another replica applied it while this one waited
        for statement in migration.statements:
            await db.execute(statement, timeout=MIGRATION_TIMEOUT)
        await db.execute(
            "INSERT INTO schema_version (version, description) VALUES ($1, $2)",
            migration.version,
            migration.description,
        )
    return True
