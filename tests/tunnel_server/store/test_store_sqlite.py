"""The SQLite store's plumbing: the file, its durability, migrations, the worker thread."""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import stat
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import closing, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import pytest

from tunnel_server.store import (
    Cluster,
    SchemaVersionError,
    SqliteStore,
    StoreError,
    hash_token,
    sqlite_ops,
    sqlite_schema,
)
from tunnel_server.store.sqlite import THREAD_NICENESS
from tunnel_server.store.sqlite_codec import encode_time
from tunnel_server.store.sqlite_schema import MIGRATIONS, Migration

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
T = TypeVar("T")

EXTRA = Migration(
    version=len(MIGRATIONS) + 1,
    description="a table a later feature adds",
    statements=("CREATE TABLE later_feature (id INTEGER PRIMARY KEY)",),
)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "state.db"


@pytest.fixture
async def store(path: Path) -> AsyncIterator[SqliteStore]:
    store = await SqliteStore.open(path)
    yield store
    await store.close()


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@contextmanager
def _raw(path: Path) -> Iterator[sqlite3.Connection]:
    """A connection of the test's own, to look at the file from outside the store."""
    with closing(sqlite3.connect(path, isolation_level=None)) as connection:
        yield connection


async def test_new_database_file_is_readable_by_its_owner_only(
    store: SqliteStore, path: Path
) -> None:
    await store.add_cluster("prod", NOW)  # a write, so that the WAL file exists too
    assert _mode(path) == 0o600
    assert _mode(Path(f"{path}-wal")) == 0o600


async def test_database_file_is_created_0600_whatever_the_umask(path: Path) -> None:
    old = os.umask(0)
    try:
        store = await SqliteStore.open(path)
    finally:
        os.umask(old)
    await store.close()
    assert _mode(path) == 0o600


async def test_existing_file_others_can_read_is_reported(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await (await SqliteStore.open(path)).close()
    os.chmod(path, 0o644)
    with caplog.at_level(logging.WARNING, logger="tunnel_server.store.sqlite"):
        store = await SqliteStore.open(path)
    await store.close()
    assert any("chmod 600" in record.getMessage() for record in caplog.records)


async def test_database_runs_in_wal_mode(store: SqliteStore, path: Path) -> None:
    with _raw(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_new_database_is_at_the_latest_schema_version(store: SqliteStore) -> None:
    assert await store.schema_version() == len(MIGRATIONS)


def test_migration_versions_count_up_from_one() -> None:
    assert [m.version for m in MIGRATIONS] == list(range(1, len(MIGRATIONS) + 1))


async def test_reopening_applies_no_migration_twice(path: Path) -> None:
    await (await SqliteStore.open(path)).close()
    # Were migration 1 applied again, its CREATE TABLE statements would fail the open.
    store = await SqliteStore.open(path)
    try:
        assert await store.schema_version() == len(MIGRATIONS)
    finally:
        await store.close()
    with _raw(path) as raw:
        versions = [row[0] for row in raw.execute("SELECT version FROM schema_version")]
    assert versions == list(range(1, len(MIGRATIONS) + 1))


async def test_a_later_migration_is_applied_once_to_an_existing_database(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await SqliteStore.open(path)
    await store.add_cluster("prod", NOW)
    await store.close()

    monkeypatch.setattr(sqlite_schema, "MIGRATIONS", (*MIGRATIONS, EXTRA))
    for _ in range(2):
        store = await SqliteStore.open(path)
        try:
            assert await store.schema_version() == EXTRA.version
            assert [c.name for c in await store.list_clusters()] == ["prod"]
        finally:
            await store.close()
    with _raw(path) as raw:
        applied = raw.execute(
            "SELECT count(*) FROM schema_version WHERE version = ?", (EXTRA.version,)
        ).fetchone()[0]
        assert applied == 1
        assert raw.execute("SELECT count(*) FROM later_feature").fetchone()[0] == 0


async def test_tokens_made_before_they_could_expire_keep_working_after_the_upgrade(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before_expiry = next(m for m in MIGRATIONS if m.description == "API tokens that expire")
    with monkeypatch.context() as patch:
        patch.setattr(sqlite_schema, "MIGRATIONS", MIGRATIONS[: before_expiry.version - 1])
        with _raw(path) as raw:
            sqlite_schema.migrate(raw)
            raw.execute(
                "INSERT INTO users (name, groups, is_admin, created_at) VALUES (?, ?, ?, ?)",
                ("ann", "[]", 0, encode_time(NOW)),
            )
            raw.execute(
                "INSERT INTO api_tokens (token_hash, user_name, created_at) VALUES (?, ?, ?)",
                (hash_token("old"), "ann", encode_time(NOW)),
            )
    store = await SqliteStore.open(path)
    try:
        [token] = await store.list_api_tokens("ann")
        assert token.expires_at is None
        assert await store.find_user_by_token(hash_token("old")) is not None
    finally:
        await store.close()


async def test_a_database_newer_than_the_code_is_refused(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as patch:
        patch.setattr(sqlite_schema, "MIGRATIONS", (*MIGRATIONS, EXTRA))
        await (await SqliteStore.open(path)).close()
    with pytest.raises(SchemaVersionError, match="upgrade the server"):
        await SqliteStore.open(path)


async def test_a_failing_migration_leaves_the_database_at_its_previous_version(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await (await SqliteStore.open(path)).close()
    broken = Migration(
        version=len(MIGRATIONS) + 1,
        description="fails half way",
        statements=("CREATE TABLE half_done (id INTEGER)", "THIS IS NOT SQL"),
    )
    with monkeypatch.context() as patch:
        patch.setattr(sqlite_schema, "MIGRATIONS", (*MIGRATIONS, broken))
        with pytest.raises(StoreError, match="cannot open the state database"):
            await SqliteStore.open(path)
    store = await SqliteStore.open(path)
    try:
        assert await store.schema_version() == len(MIGRATIONS)
    finally:
        await store.close()
    with _raw(path) as raw:
        tables = {row[0] for row in raw.execute("SELECT name FROM sqlite_master")}
    assert "half_done" not in tables


def test_migrations_out_of_order_are_refused(path: Path) -> None:
    skipping = (*MIGRATIONS, Migration(len(MIGRATIONS) + 2, "skips one", ()))
    with _raw(path) as raw, pytest.raises(SchemaVersionError, match="out of order"):
        sqlite_schema.migrate(raw, skipping)


def _write_garbage(path: Path) -> None:
    path.write_bytes(b"this is not a database, it only has a name like one" * 100)
    path.chmod(0o600)


async def test_a_file_that_is_not_a_database_is_refused(path: Path) -> None:
    _write_garbage(path)
    with pytest.raises(StoreError, match="cannot open the state database"):
        await SqliteStore.open(path)


async def test_a_missing_directory_fails_with_a_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="No such file or directory") as caught:
        await SqliteStore.open(tmp_path / "missing" / "state.db")
    assert isinstance(caught.value.__cause__, OSError)


async def test_an_sqlite_without_returning_is_refused_by_name(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite3, "sqlite_version_info", (3, 34, 1))
    monkeypatch.setattr(sqlite3, "sqlite_version", "3.34.1")
    with pytest.raises(StoreError, match=r"SQLite 3\.34\.1 is too old.*3\.35\.0 or later"):
        await SqliteStore.open(path)


async def test_close_lets_work_already_submitted_finish(path: Path) -> None:
    store = await SqliteStore.open(path)
    adding = [asyncio.ensure_future(store.add_cluster(f"c{i}", NOW)) for i in range(10)]
    await asyncio.sleep(0)  # one turn of the loop: each task runs up to its submission
    await store.close()
    assert [c.name for c in await asyncio.gather(*adding)] == [f"c{i}" for i in range(10)]


def on_the_database_thread(monkeypatch: pytest.MonkeyPatch, probe: Callable[[], T]) -> list[T]:
    """What ``probe`` returns where the store lists clusters, once per listing."""
    seen: list[T] = []
    original = sqlite_ops.list_clusters

    def spy(db: sqlite3.Connection) -> list[Cluster]:
        seen.append(probe())
        return original(db)

    monkeypatch.setattr(sqlite_ops, "list_clusters", spy)
    return seen


async def test_all_database_work_runs_on_one_thread_that_is_not_the_loops(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads = on_the_database_thread(monkeypatch, threading.get_ident)
    await asyncio.gather(*(store.list_clusters() for _ in range(5)))
    assert len(threads) == 5
    assert len(set(threads)) == 1
    assert threads[0] != threading.get_ident()


@pytest.mark.skipif(sys.platform != "linux", reason="only Linux gives a thread its own nice value")
async def test_the_database_thread_runs_at_a_lower_cpu_priority_than_the_event_loop(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its bursts of audit writes give way to the requests on the event loop's thread."""

    def niceness() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    seen = on_the_database_thread(monkeypatch, niceness)
    await store.list_clusters()
    assert seen == [min(19, niceness() + THREAD_NICENESS)]


async def test_a_lock_held_by_another_process_becomes_a_store_error(path: Path) -> None:
    store = await SqliteStore.open(path, busy_timeout=0.05)
    try:
        with _raw(path) as other:
            other.execute("BEGIN IMMEDIATE")  # holds the write lock, as another process would
            try:
                with pytest.raises(StoreError, match="locked") as caught:
                    await store.add_cluster("prod", NOW)
            finally:
                other.execute("ROLLBACK")
        assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
        await store.add_cluster("prod", NOW)  # the store works again once the lock is gone
    finally:
        await store.close()
