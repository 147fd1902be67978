"""The database thread's batches: one transaction per batch, each operation undone alone."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

from tunnel_server.store.base import StoreClosedError, StoreError
from tunnel_server.store.sqlite_schema import transaction
from tunnel_server.store.sqlite_worker import MAX_BATCH, DatabaseWorker


class Refused(StoreError):
    """What ``translate`` turns every sqlite3 error into, in these tests."""


def _translate(exc: sqlite3.Error) -> StoreError:
    return Refused(f"refused: {exc}")


class Database:
    """A worker on a file database, a log of the statements it ran, and a way to pause it."""

    def __init__(self, path: Path) -> None:
        self.executor = ThreadPoolExecutor(max_workers=1)
        self.statements: list[str] = []
        self.closed = False
        self.db = self.executor.submit(self._connect, path).result()
        self.worker = DatabaseWorker(self.executor, self.db, _translate)

    def _connect(self, path: Path) -> sqlite3.Connection:
        db = sqlite3.connect(path, isolation_level=None)
        db.set_trace_callback(self.statements.append)
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA foreign_keys = ON")
        db.execute("CREATE TABLE items (name TEXT PRIMARY KEY)")
        db.execute(
            "CREATE TABLE refs (name TEXT REFERENCES items (name) DEFERRABLE INITIALLY DEFERRED)"
        )
        self.statements.clear()
        return db

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Hold the database thread, so that what is submitted meanwhile forms one batch."""
        release = threading.Event()
        started = threading.Event()

        def hold() -> None:
            started.set()
            release.wait()

        self.executor.submit(hold)
        started.wait()
        try:
            yield
        finally:
            release.set()

    def names(self) -> list[str]:
        rows = self.executor.submit(
            lambda: self.db.execute("SELECT name FROM items ORDER BY name").fetchall()
        ).result()
        return [row[0] for row in rows]

    def commits(self) -> int:
        return self.statements.count("COMMIT")

    def close(self) -> None:
        """Close the connection on its thread and stop the thread (once)."""
        if not self.closed:
            self.closed = True
            self.executor.submit(self.db.close).result()
            self.executor.shutdown()


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Database]:
    database = Database(tmp_path / "state.db")
    yield database
    database.close()


def insert(name: str) -> Callable[[sqlite3.Connection], str]:
    def operation(db: sqlite3.Connection) -> str:
        db.execute("INSERT INTO items (name) VALUES (?)", (name,))
        return name

    return operation


class Boom(Exception):
    """An operation's own failure."""


def insert_then_fail(name: str) -> Callable[[sqlite3.Connection], None]:
    def operation(db: sqlite3.Connection) -> None:
        db.execute("INSERT INTO items (name) VALUES (?)", (name,))
        raise Boom(name)

    return operation


async def test_operations_queued_together_commit_in_one_transaction(database: Database) -> None:
    with database.paused():
        futures = [database.worker.submit(insert(f"item-{n:02}")) for n in range(20)]
    assert await asyncio.gather(*futures) == [f"item-{n:02}" for n in range(20)]
    assert database.commits() == 1
    assert database.names() == [f"item-{n:02}" for n in range(20)]


def batch_sizes(statements: list[str]) -> list[int]:
    """The operations in each batched transaction of a statement trace."""
    sizes: list[int] = []
    for statement in statements:
        if statement == "BEGIN IMMEDIATE":
            sizes.append(0)
        elif statement == "SAVEPOINT operation":
            sizes[-1] += 1
    return sizes


async def test_a_batch_holds_at_most_max_batch_operations(database: Database) -> None:
    with database.paused():
        futures = [database.worker.submit(insert(f"item-{n}")) for n in range(MAX_BATCH + 3)]
    await asyncio.gather(*futures)
    assert batch_sizes(database.statements) == [MAX_BATCH, 3]
    assert len(database.names()) == MAX_BATCH + 3


async def test_a_failing_operation_is_undone_alone_and_its_caller_gets_the_error(
    database: Database,
) -> None:
    with database.paused():
        before = database.worker.submit(insert("before"))
        failing = database.worker.submit(insert_then_fail("failing"))
        after = database.worker.submit(insert("after"))
    assert await before == "before"
    with pytest.raises(Boom, match="failing"):
        await failing
    assert await after == "after"
    assert database.names() == ["after", "before"]
    assert database.commits() == 1


async def test_an_sqlite_error_reaches_its_caller_translated(database: Database) -> None:
    await database.worker.submit(insert("taken"))
    with database.paused():
        duplicate = database.worker.submit(insert("taken"))
        other = database.worker.submit(insert("other"))
    with pytest.raises(Refused, match="UNIQUE constraint failed") as caught:
        await duplicate
    assert isinstance(caught.value.__cause__, sqlite3.IntegrityError)
    assert await other == "other"


async def test_a_failed_commit_fails_every_operation_of_its_batch_and_keeps_nothing(
    database: Database,
) -> None:
    def dangling_reference(db: sqlite3.Connection) -> None:
        # A deferred foreign key is only checked at COMMIT.
        db.execute("INSERT INTO refs (name) VALUES ('nowhere')")

    with database.paused():
        first = database.worker.submit(insert("first"))
        dangling = database.worker.submit(dangling_reference)
    for future in (first, dangling):
        with pytest.raises(Refused, match="FOREIGN KEY constraint failed"):
            await future
    assert database.names() == []
    # The connection is usable again at once.
    assert await database.worker.submit(insert("later")) == "later"
    assert database.names() == ["later"]


async def test_a_nested_transaction_in_a_batch_becomes_a_savepoint(database: Database) -> None:
    def two_then_fail(db: sqlite3.Connection) -> None:
        with transaction(db):
            db.execute("INSERT INTO items (name) VALUES ('nested-1')")
            db.execute("INSERT INTO items (name) VALUES ('nested-2')")
            raise Boom("nested")

    def two(db: sqlite3.Connection) -> None:
        with transaction(db):
            db.execute("INSERT INTO items (name) VALUES ('kept-1')")
            db.execute("INSERT INTO items (name) VALUES ('kept-2')")

    with database.paused():
        failing = database.worker.submit(two_then_fail)
        kept = database.worker.submit(two)
    with pytest.raises(Boom):
        await failing
    await kept
    assert database.names() == ["kept-1", "kept-2"]
    assert database.commits() == 1


async def test_an_operation_alone_runs_outside_any_transaction(database: Database) -> None:
    def in_transaction(db: sqlite3.Connection) -> bool:
        return db.in_transaction

    assert await database.worker.submit(in_transaction) is False
    assert "BEGIN IMMEDIATE" not in database.statements


async def test_an_operation_alone_that_fails_leaves_no_transaction_open(
    database: Database,
) -> None:
    def begin_and_fail(db: sqlite3.Connection) -> None:
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO items (name) VALUES ('half')")
        raise Boom("half-way")

    with pytest.raises(Boom):
        await database.worker.submit(begin_and_fail)
    assert await database.worker.submit(insert("next")) == "next"
    assert database.names() == ["next"]


async def test_a_cancelled_caller_does_not_disturb_the_batch(database: Database) -> None:
    with database.paused():
        abandoned = database.worker.submit(insert("abandoned"))
        awaited = database.worker.submit(insert("awaited"))
        abandoned.cancel()
    assert await awaited == "awaited"
    # Cancelling does not withdraw the operation: it ran with its batch.
    assert database.names() == ["abandoned", "awaited"]


def fill_the_disk(db: sqlite3.Connection) -> None:
    """Cap the file at its current size: the next page it needs fails with SQLITE_FULL."""
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.execute(f"PRAGMA max_page_count = {pages}")


def insert_big(name: str) -> Callable[[sqlite3.Connection], None]:
    def operation(db: sqlite3.Connection) -> None:
        db.execute("INSERT INTO items (name) VALUES (?)", (name + "x" * 100_000,))

    return operation


async def test_a_full_disk_reaches_every_caller_of_the_batch_as_itself(
    database: Database,
) -> None:
    await database.worker.submit(fill_the_disk)
    with database.paused():
        small = database.worker.submit(insert("small"))
        big = database.worker.submit(insert_big("big"))
    for future in (small, big):
        with pytest.raises(Refused, match="database or disk is full"):
            await future
    assert database.names() == []


async def test_a_full_disk_in_a_lone_transaction_reaches_its_caller_as_itself(
    database: Database,
) -> None:
    await database.worker.submit(fill_the_disk)

    def in_a_transaction(db: sqlite3.Connection) -> None:
        with transaction(db):
            insert_big("big")(db)

    with pytest.raises(Refused, match="database or disk is full"):
        await database.worker.submit(in_a_transaction)


async def test_an_operation_that_leaks_a_transaction_fails_and_keeps_nothing(
    database: Database,
) -> None:
    def begin_and_leave(db: sqlite3.Connection) -> None:
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO items (name) VALUES ('leaked')")

    with pytest.raises(StoreError, match="left a transaction open"):
        await database.worker.submit(begin_and_leave)
    assert await database.worker.submit(insert("next")) == "next"
    assert database.names() == ["next"]


async def test_an_operation_that_commits_inside_a_batch_fails_the_batch(
    database: Database,
) -> None:
    def commit(db: sqlite3.Connection) -> None:
        db.execute("COMMIT")

    with database.paused():
        rogue = database.worker.submit(commit)
        other = database.worker.submit(insert("other"))
    for future in (rogue, other):
        with pytest.raises(StoreError, match="ended the batch's transaction"):
            await future


async def test_an_interrupt_inside_an_operation_fails_its_batch_and_not_the_worker(
    database: Database,
) -> None:
    def interrupted(db: sqlite3.Connection) -> None:
        raise KeyboardInterrupt

    with database.paused():
        first = database.worker.submit(interrupted)
        second = database.worker.submit(insert("second"))
    for future in (first, second):
        with pytest.raises(StoreError, match="database thread failed"):
            await future
    assert await database.worker.submit(insert("later")) == "later"
    assert database.names() == ["later"]


async def test_each_caller_of_a_failed_batch_gets_its_own_error(database: Database) -> None:
    await database.worker.submit(fill_the_disk)
    with database.paused():
        futures = [database.worker.submit(insert_big(f"big-{n}")) for n in range(2)]
    for future in futures:
        with pytest.raises(Refused):
            await future
    errors = [future.exception() for future in futures]
    assert errors[0] is not errors[1]


async def test_submitting_after_the_executor_is_shut_down_is_refused(
    database: Database,
) -> None:
    database.close()
    with pytest.raises(StoreClosedError):
        database.worker.submit(insert("late"))
