"""The database thread: queued operations run in batches, one transaction per batch.

Every store call becomes an operation on one queue. One worker thread, the
connection's owner, takes everything queued so far (up to ``MAX_BATCH``) and
runs it in a single write transaction, each operation inside its own
savepoint: an operation that fails is rolled back alone and its caller gets
the error, the others commit together. Callers are answered only after the
COMMIT, so what a caller sees stored is stored (as durably as
``synchronous=NORMAL`` makes it).

Why: under load (a burst of submissions while results arrive) a commit and a
thread hand-off per operation cost more than the operations; a batch pays for
one of each. An idle store sees batches of one, which run without savepoints.

An operation must therefore not BEGIN, COMMIT or ROLLBACK itself (it uses
``sqlite_schema.transaction``, which becomes a savepoint inside a batch), nor
run what SQLite refuses inside a transaction (VACUUM, some PRAGMAs); one that
ends or leaks the transaction fails loudly. If SQLite abandons a transaction
itself (disk full, an I/O error), every caller of that batch gets that error.

The worker also remembers whether the database can be written
(:attr:`DatabaseWorker.write_failure`): set by an error that says it cannot
(disk full, an I/O error, a read-only file), and cleared only by a write that
needs room of its own (``SqliteStore.health``'s probe): an update in place
can succeed on a full disk while every insert fails. The server's ``/readyz``
reports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from tunnel_server.store.base import StoreClosedError, StoreError

__all__ = ["MAX_BATCH", "DatabaseWorker"]

T = TypeVar("T")

MAX_BATCH = 256
"""Most operations in one transaction: bounds how long a batch holds the write lock."""

Operation = Callable[[sqlite3.Connection], Any]
_Item = tuple[Operation, "asyncio.Future[Any]"]
_Outcome = tuple["asyncio.Future[Any]", Any, BaseException | None]

#: SQLite's primary result codes that say nothing can be written (sqlite.org/rescode.html).
_CANNOT_WRITE = frozenset({8, 10, 13})  # SQLITE_READONLY, SQLITE_IOERR, SQLITE_FULL


class DatabaseWorker:
    """Runs operations on ``connection`` on ``executor``'s one thread, in batches.

    ``translate`` turns a :class:`sqlite3.Error` that an operation did not
    handle into the :class:`StoreError` its caller receives.
    """

    def __init__(
        self,
        executor: ThreadPoolExecutor,
        connection: sqlite3.Connection,
        translate: Callable[[sqlite3.Error], StoreError],
    ) -> None:
        self._executor = executor
        self._db = connection  # touched only on the executor's thread
        self._translate = translate
        self._queue: deque[_Item] = deque()
        self._lock = threading.Lock()  # guards _queue's emptiness and _scheduled together
        self._scheduled = False
        #: Why the last write failed, while no write has succeeded since (else None).
        #: Set and cleared on the database thread; read anywhere.
        self.write_failure: str | None = None

    def submit(self, operation: Callable[[sqlite3.Connection], T]) -> asyncio.Future[T]:
        """Queue ``operation(connection)``; the future settles once its batch has committed.

        Cancelling the future does not withdraw the operation: it may still run.
        """
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        item: _Item = (operation, future)
        with self._lock:
            self._queue.append(item)
            if self._scheduled:
                return future
            self._scheduled = True
        try:
            self._executor.submit(self._drain)
        except RuntimeError as exc:  # the executor is shut down: nothing will run it
            with self._lock:
                self._scheduled = False
                self._queue.remove(item)  # alone: no drain was scheduled, so none took it
            raise StoreClosedError("the state store is closed") from exc
        return future

    # --- on the database thread ---

    def _drain(self) -> None:
        batch: list[_Item] = []
        try:
            while True:
                with self._lock:
                    if not self._queue:
                        self._scheduled = False
                        return
                    count = min(len(self._queue), MAX_BATCH)
                    batch = [self._queue.popleft() for _ in range(count)]
                try:
                    outcomes = self._run_batch(batch)
                except Exception as exc:  # noqa: BLE001 - the batch failed whole: to its callers
                    self._abandon()
                    self._note_failure(exc)
                    outcomes = [(future, None, self._batch_error(exc)) for _, future in batch]
                else:
                    for _, _, error in outcomes:
                        if error is not None:
                            self._note_failure(error.__cause__ or error)
                batch = []
                _settle(outcomes)
        except BaseException:
            # Something escaped (an interrupt inside an operation, a bug here).
            # Fail what was in hand and what is queued rather than leave their
            # callers waiting for good; the next submission starts afresh.
            self._abandon()
            with self._lock:
                stranded = [*batch, *self._queue]
                self._queue.clear()
                self._scheduled = False
            _settle(
                [
                    (future, None, StoreError("the state database thread failed; retry"))
                    for _, future in stranded
                ]
            )
            raise

    def _run_batch(self, batch: list[_Item]) -> list[_Outcome]:
        db = self._db
        if len(batch) == 1:
            # Alone, an operation runs as it would without batching: reads in
            # autocommit mode, writes in the transactions they open themselves.
            operation, future = batch[0]
            try:
                value = operation(db)
            except Exception as exc:  # noqa: BLE001 - handed to the caller
                self._abandon()
                return [(future, None, self._caller_error(exc))]
            if db.in_transaction:
                raise StoreError(f"{_name(operation)} left a transaction open")
            return [(future, value, None)]
        db.execute("BEGIN IMMEDIATE")
        outcomes: list[_Outcome] = []
        for operation, future in batch:
            db.execute("SAVEPOINT operation")
            try:
                value = operation(db)
            except Exception as exc:  # the caller's: only its changes are undone
                if not db.in_transaction:
                    # SQLite rolled back the whole transaction itself (disk
                    # full, I/O error): every operation of the batch is undone.
                    raise
                db.execute("ROLLBACK TO operation")
                db.execute("RELEASE operation")
                outcomes.append((future, None, self._caller_error(exc)))
                continue
            if not db.in_transaction:
                raise StoreError(f"{_name(operation)} ended the batch's transaction")
            db.execute("RELEASE operation")
            outcomes.append((future, value, None))
        db.execute("COMMIT")
        return outcomes

    def _abandon(self) -> None:
        """Roll back whatever transaction a failure left open."""
        if self._db.in_transaction:
            # If even that fails, the connection has already ended the transaction.
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")

    def _note_failure(self, exc: BaseException | None) -> None:
        """Remember ``exc`` if it says the database cannot be written."""
        if isinstance(exc, sqlite3.Error):
            code = getattr(exc, "sqlite_errorcode", 0)
            if code & 0xFF in _CANNOT_WRITE:
                self.write_failure = str(exc) or getattr(exc, "sqlite_errorname", "")

    def _caller_error(self, exc: Exception) -> BaseException:
        """The error one caller receives for its own operation's failure."""
        if isinstance(exc, sqlite3.Error):
            translated = self._translate(exc)
            translated.__cause__ = exc
            return translated
        return exc

    def _batch_error(self, exc: Exception) -> BaseException:
        """A fresh error for each caller of a batch that failed whole (not one shared object,
        whose traceback would gather every caller's frames)."""
        error = (
            self._translate(exc)
            if isinstance(exc, sqlite3.Error)
            else StoreError(f"the state database failed: {exc}")
        )
        error.__cause__ = exc
        return error


def _name(operation: Operation) -> str:
    return getattr(operation, "__qualname__", repr(operation))


def _settle(outcomes: list[_Outcome]) -> None:
    """Hand each outcome to its future, with one wake-up per event loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[_Outcome]] = {}
    for outcome in outcomes:
        by_loop.setdefault(outcome[0].get_loop(), []).append(outcome)
    for loop, mine in by_loop.items():
        try:
            loop.call_soon_threadsafe(_deliver, mine)
        except RuntimeError:  # that loop is closed: nobody is waiting any more
            continue


def _deliver(outcomes: list[_Outcome]) -> None:
    """On the event loop: set each future that its caller still awaits."""
    for future, value, error in outcomes:
        if future.done():  # the caller was cancelled
            continue
        if error is None:
            future.set_result(value)
        else:
            future.set_exception(error)
