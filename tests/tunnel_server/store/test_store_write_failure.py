"""A store that cannot write says so, and says when it can again (the server's /readyz)."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tunnel_server.store import AuditEvent, SqliteStore, StoreError, sqlite, sqlite_schema
from tunnel_server.store.sqlite import PROBE_SPACING

NOW = datetime(2026, 5, 1, tzinfo=UTC)
BIG = {"note": "x" * 16_000}


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    store = await SqliteStore.open(tmp_path / "state.db")
    yield store
    await store.close()


def failure(store: SqliteStore) -> str | None:
    """The store's write failure, read afresh (mypy would keep a narrowed attribute)."""
    return store.write_failure


async def cap_pages(store: SqliteStore, pages: int | None) -> None:
    """Let the database grow to ``pages`` pages at most (None: its current size), as a
    full volume would: SQLite then refuses a write that needs a page with SQLITE_FULL."""

    def cap(db: sqlite3.Connection) -> None:
        size = pages if pages is not None else db.execute("PRAGMA page_count").fetchone()[0]
        db.execute(f"PRAGMA max_page_count = {int(size)}")

    await store._run(cap)


async def fill(store: SqliteStore) -> StoreError:
    """Write large audit events until the store refuses one; return its error."""
    for _ in range(1000):
        try:
            await store.add_audit_events(
                [AuditEvent(None, NOW, "ann", None, "admin", "x", detail=BIG)]
            )
        except StoreError as exc:
            return exc
    raise AssertionError("the capped database took 1000 large events")


async def test_a_full_database_is_reported_until_a_write_succeeds_again(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite, "PROBE_SPACING", 0.0)
    await store.health()
    assert failure(store) is None
    await cap_pages(store, None)

    refused = await fill(store)

    assert "database or disk is full" in str(refused)
    assert failure(store) == "database or disk is full"
    with pytest.raises(StoreError, match=r"cannot be written \(database or disk is full\): free"):
        await store.health()
    assert failure(store) is not None  # the probe could not write either

    await cap_pages(store, 1_000_000)
    await store.health()  # the probe writes, and clears the failure
    assert failure(store) is None
    await store.health()


async def test_only_a_write_that_needs_room_clears_a_failure(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An update in place succeeds on a full disk while every insert fails: it proves nothing."""
    monkeypatch.setattr(sqlite, "PROBE_SPACING", 0.0)
    await store.add_cluster("prod", NOW)
    await cap_pages(store, None)
    await fill(store)
    await store.list_audit()
    await store.touch_cluster("prod", NOW)  # an agent's heartbeat: rewrites a row in place
    assert failure(store) is not None
    with pytest.raises(StoreError, match="cannot be written"):
        await store.health()

    await cap_pages(store, 1_000_000)
    await store.add_user("ann", (), False, NOW)
    assert failure(store) is not None  # until the probe has written
    await store.health()
    assert failure(store) is None


async def test_errors_that_are_not_about_writing_leave_the_store_writable(
    store: SqliteStore,
) -> None:
    await store.add_user("ann", (), False, NOW)
    with pytest.raises(StoreError, match="already exists"):
        await store.add_user("ann", (), False, NOW)
    assert failure(store) is None
    await store.health()


async def test_a_failing_store_is_probed_at_most_once_a_second(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/readyz answers anyone: asking it again and again must not make the store write."""
    probes: list[int] = []
    probe_write = sqlite_schema.probe_write

    def counted(db: sqlite3.Connection) -> None:
        probes.append(1)
        probe_write(db)

    monkeypatch.setattr(sqlite_schema, "probe_write", counted)
    now = [1000.0]
    store.clock = lambda: now[0]
    await cap_pages(store, None)
    await fill(store)
    for _ in range(5):
        with pytest.raises(StoreError, match="cannot be written"):
            await store.health()
    assert len(probes) == 1

    now[0] += PROBE_SPACING
    await cap_pages(store, 1_000_000)
    await store.health()
    assert len(probes) == 2
    assert failure(store) is None
