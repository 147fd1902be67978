"""What only the PostgreSQL store does: migrations, the pool, timeouts, replicas, errors.

Each test has a database of its own on a real server (``store_engines``).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

import asyncpg
import pytest

from tests.tunnel_server.store_engines import database_url
from tunnel_server.store import (
    InvalidValueError,
    PostgresStore,
    SchemaVersionError,
    Store,
    StoreClosedError,
    StoreError,
    postgres,
    postgres_schema,
)
from tunnel_server.store.commands import NewCommand
from tunnel_server.store.postgres import redact_url
from tunnel_server.store.postgres_schema import MIGRATIONS, Migration

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
LEASE = NOW + timedelta(seconds=30)
PASSWORD = "s3cret-pw"

EXTRA = Migration(
    version=len(MIGRATIONS) + 1,
    description="a table a later feature adds",
    statements=("CREATE TABLE later_feature (id BIGINT PRIMARY KEY)",),
)


@pytest.fixture
async def raw(postgres_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection of the test's own, to look at the database from outside the store."""
    connection = await asyncpg.connect(postgres_url)
    yield connection
    await connection.close()


@pytest.fixture
async def store(postgres_url: str) -> AsyncIterator[PostgresStore]:
    store = await PostgresStore.open(postgres_url, max_connections=4)
    yield store
    await store.close()


async def until(condition: Callable[[], Awaitable[bool]], what: str) -> None:
    """Wait until the database shows ``condition``.

    Which sessions wait on a lock is the server's state, with no event to wait on:
    each turn asks the server again, and the deadline only turns a hang into a failure.
    """
    try:
        async with asyncio.timeout(20):
            while not await condition():  # noqa: ASYNC110 - no event exists to wait on
                await asyncio.sleep(0.01)
    except TimeoutError:
        pytest.fail(f"the database never showed {what}")


def free_port() -> int:
    """A port nothing listens on (bound and released at once)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


# --- migrations -------------------------------------------------------------------


async def test_an_empty_database_is_migrated_to_the_latest_version(
    store: PostgresStore, raw: asyncpg.Connection
) -> None:
    assert await store.schema_version() == len(MIGRATIONS)
    tables = {
        row["tablename"]
        for row in await raw.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    }
    assert tables >= {"clusters", "users", "grants", "audit", "commands", "command_logs"}
    versions = await raw.fetch("SELECT version FROM schema_version ORDER BY version")
    assert [row["version"] for row in versions] == list(range(1, len(MIGRATIONS) + 1))


def test_migration_versions_count_up_from_one() -> None:
    assert [m.version for m in MIGRATIONS] == list(range(1, len(MIGRATIONS) + 1))


async def test_reopening_applies_no_migration_twice(
    postgres_url: str, raw: asyncpg.Connection
) -> None:
    await (await PostgresStore.open(postgres_url)).close()
    before = await raw.fetch("SELECT * FROM schema_version ORDER BY version")
    async with await PostgresStore.open(postgres_url) as store:
        assert await store.schema_version() == len(MIGRATIONS)
    assert await raw.fetch("SELECT * FROM schema_version ORDER BY version") == before


async def test_replicas_opening_an_empty_database_together_migrate_it_once(
    postgres_url: str, raw: asyncpg.Connection
) -> None:
    stores = await asyncio.gather(*(PostgresStore.open(postgres_url) for _ in range(4)))
    for store in stores:
        await store.close()
    count = await raw.fetchval("SELECT count(*) FROM schema_version")
    assert count == len(MIGRATIONS)


async def test_a_later_migration_is_applied_once_to_an_existing_database(
    postgres_url: str, raw: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with await PostgresStore.open(postgres_url) as store:
        await store.add_cluster("prod", NOW)
    monkeypatch.setattr(postgres_schema, "MIGRATIONS", (*MIGRATIONS, EXTRA))
    for _ in range(2):
        async with await PostgresStore.open(postgres_url) as store:
            assert await store.schema_version() == len(MIGRATIONS) + 1
            assert [c.name for c in await store.list_clusters()] == ["prod"]
    assert await raw.fetchval("SELECT count(*) FROM schema_version") == len(MIGRATIONS) + 1
    assert await raw.fetchval("SELECT to_regclass('later_feature')::text") == "later_feature"


async def test_a_database_newer_than_the_code_is_refused(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as patch:
        patch.setattr(postgres_schema, "MIGRATIONS", (*MIGRATIONS, EXTRA))
        await (await PostgresStore.open(postgres_url)).close()
    with pytest.raises(SchemaVersionError, match="upgrade the server"):
        await PostgresStore.open(postgres_url)


async def test_a_failing_migration_leaves_the_database_at_its_previous_version(
    postgres_url: str, raw: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    await (await PostgresStore.open(postgres_url)).close()
    broken = Migration(
        version=len(MIGRATIONS) + 1,
        description="fails half way",
        statements=("CREATE TABLE half_done (id INTEGER)", "THIS IS NOT SQL"),
    )
    with monkeypatch.context() as patch:
        patch.setattr(postgres_schema, "MIGRATIONS", (*MIGRATIONS, broken))
        with pytest.raises(StoreError, match="syntax error"):
            await PostgresStore.open(postgres_url)
    async with await PostgresStore.open(postgres_url) as store:
        assert await store.schema_version() == len(MIGRATIONS)
    assert await raw.fetchval("SELECT to_regclass('half_done')") is None


def test_migrations_out_of_order_are_refused() -> None:
    skipping = (*MIGRATIONS, Migration(len(MIGRATIONS) + 2, "skips one", ()))
    with pytest.raises(SchemaVersionError, match="out of order"):
        asyncio.run(postgres_schema.migrate(None, skipping))  # type: ignore[arg-type]


# --- replicas and the pool ----------------------------------------------------------


async def test_replicas_competing_for_pending_commands_never_deliver_one_twice(
    store: PostgresStore, postgres_url: str
) -> None:
    """Three stores on one database (three replicas), many offers each, at once."""
    for i in range(30):
        command = NewCommand(f"c{i:02}", "prod", "ann", "query", "q", {}, 3, 60.0)
        await store.add_command(command, NOW)
    replicas: list[Store] = [store]
    replicas += [await PostgresStore.open(postgres_url, max_connections=3) for _ in range(2)]
    try:

        async def offer(replica: Store) -> list[str]:
            won = []
            for record in await replica.pending_commands("prod"):
                if await replica.mark_delivered(record.id, record.attempt + 1, NOW, LEASE):
                    won.append(record.id)
            return won

        rounds = await asyncio.gather(*(offer(replicas[i % 3]) for i in range(12)))
    finally:
        for replica in replicas[1:]:
            await replica.close()
    delivered = [command_id for won in rounds for command_id in won]
    assert sorted(delivered) == [f"c{i:02}" for i in range(30)]
    assert {c.attempt for c in await store.list_commands(state="delivered")} == {1}


async def _sessions_waiting(raw: asyncpg.Connection) -> int:
    await raw.execute("SELECT pg_stat_clear_snapshot()")  # else fixed for the transaction
    count = await raw.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name = 'tunnel-server' AND wait_event_type = 'Lock'"
    )
    return int(count)


async def test_the_pool_never_opens_more_connections_than_its_bound(
    postgres_url: str, raw: asyncpg.Connection
) -> None:
    async with await PostgresStore.open(postgres_url, max_connections=2) as store:
        async with raw.transaction():
            await raw.execute("LOCK TABLE clusters IN ACCESS EXCLUSIVE MODE")
            listings = [asyncio.ensure_future(store.list_clusters()) for _ in range(10)]
            await until(lambda: _bound(raw, 2), "two sessions waiting on the lock")
            sessions = await raw.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name = 'tunnel-server'"
            )
            assert sessions == 2
            assert not any(listing.done() for listing in listings)
        assert await asyncio.gather(*listings) == [[]] * 10


async def _bound(raw: asyncpg.Connection, sessions: int) -> bool:
    return await _sessions_waiting(raw) >= sessions


async def test_a_call_that_finds_every_connection_busy_too_long_gets_a_store_error(
    postgres_url: str, raw: asyncpg.Connection
) -> None:
    async with await PostgresStore.open(
        postgres_url, max_connections=1, acquire_timeout=0.2
    ) as store:
        async with raw.transaction():
            await raw.execute("LOCK TABLE clusters IN ACCESS EXCLUSIVE MODE")
            holding = asyncio.ensure_future(store.list_clusters())
            await until(lambda: _bound(raw, 1), "the one connection waiting on the lock")
            with pytest.raises(StoreError, match="timed out waiting for the state database"):
                await store.list_users()
        assert await holding == []
        assert await store.list_users() == []  # the store works again


async def test_a_statement_over_the_timeout_becomes_a_store_error(
    postgres_url: str, raw: asyncpg.Connection
) -> None:
    async with await PostgresStore.open(postgres_url, statement_timeout=0.2) as store:
        async with raw.transaction():
            await raw.execute("LOCK TABLE clusters IN ACCESS EXCLUSIVE MODE")
            with pytest.raises(StoreError, match="did not answer in time") as caught:
                await store.add_cluster("prod", NOW)
        assert isinstance(caught.value.__cause__, asyncpg.QueryCanceledError)
        await store.add_cluster("prod", NOW)  # the store works once the lock is gone


# --- errors -----------------------------------------------------------------------


async def test_a_server_that_does_not_answer_gives_a_clear_store_error() -> None:
    url = f"postgresql://tunnel:{PASSWORD}@127.0.0.1:{free_port()}/state"
    with pytest.raises(StoreError, match="cannot reach the state database") as caught:
        await PostgresStore.open(url, connect_timeout=5)
    assert PASSWORD not in str(caught.value)
    assert "postgresql://tunnel:***@127.0.0.1:" in str(caught.value)


async def test_a_login_the_server_refuses_gives_a_store_error_without_the_password(
    postgres_url: str,
) -> None:
    parts = urlsplit(postgres_url)
    login = f"no_such_role_here:{PASSWORD}@{parts.hostname}:{parts.port or 5432}"
    url = parts._replace(netloc=login).geturl()
    with pytest.raises(StoreError, match="refused the login") as caught:
        await PostgresStore.open(url)
    assert PASSWORD not in str(caught.value)


async def test_a_database_that_does_not_exist_gives_a_store_error(postgres_url: str) -> None:
    url = database_url(postgres_url, "tunnel_no_such_database")
    with pytest.raises(StoreError, match="does not exist"):
        await PostgresStore.open(url)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://ann:pw@db:5432/state", "postgresql://ann:***@db:5432/state"),
        ("postgresql://ann@db/state", "postgresql://ann@db/state"),
        ("postgresql://db/state?password=pw&sslmode=require", "password=***&sslmode=require"),
    ],
)
def test_urls_are_shown_without_their_passwords(url: str, shown: str) -> None:
    assert shown in redact_url(url)
    assert ":pw" not in redact_url(url)
    assert "=pw" not in redact_url(url)


async def test_a_value_postgresql_cannot_hold_is_refused_as_invalid(store: PostgresStore) -> None:
    with pytest.raises(InvalidValueError, match="refused a value"):
        await store.add_cluster("nul\x00in-a-name", NOW)
    command = NewCommand("c1", "prod", "ann", "query", "q", {"x": float("nan")}, 1, 1.0)
    with pytest.raises(InvalidValueError, match="plain JSON"):
        await store.add_command(command, NOW)


async def test_pool_settings_out_of_range_are_refused(postgres_url: str) -> None:
    with pytest.raises(InvalidValueError, match="min_connections"):
        await PostgresStore.open(postgres_url, min_connections=3, max_connections=2)


async def test_a_closed_store_refuses_every_call(store: PostgresStore) -> None:
    await store.close()
    with pytest.raises(StoreClosedError):
        await store.list_clusters()


# --- a database that cannot be written --------------------------------------------


def failure(store: Store) -> str | None:
    """The store's write failure, read afresh (mypy would keep a narrowed attribute)."""
    return store.write_failure


async def test_a_read_only_database_is_reported_until_a_write_succeeds_again(
    store: PostgresStore, raw: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(postgres, "PROBE_SPACING", 0.0)
    database = await raw.fetchval("SELECT current_database()")
    await store.health()
    assert failure(store) is None

    await raw.execute(f'ALTER DATABASE "{database}" SET default_transaction_read_only = on')
    await store._pool.expire_connections()  # new sessions take the setting
    with pytest.raises(StoreError, match="read-only"):
        await store.add_user("ann", (), False, NOW)
    assert failure(store) is not None
    with pytest.raises(StoreError, match="cannot be written"):
        await store.health()

    await raw.execute(f'ALTER DATABASE "{database}" RESET default_transaction_read_only')
    await store._pool.expire_connections()
    await store.health()  # the probe writes, and clears the failure
    assert failure(store) is None
    await store.add_user("ann", (), False, NOW)
