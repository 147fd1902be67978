"""Retention: finished commands and old audit events are deleted; nothing else is."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tunnel_server.retention import Pruned, Pruner
from tunnel_server.store import AuditEvent, NotFoundError, SqliteStore, StoreError
from tunnel_server.store.commands import CommandState, NewCommand

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
DAY = timedelta(days=1)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    store = await SqliteStore.open(tmp_path / "state.db")
    yield store
    await store.close()


async def submitted(store: SqliteStore, command_id: str, at: datetime) -> None:
    command = NewCommand(command_id, "prod", "ann", "query", command_id, {}, 2, 60.0)
    await store.add_command(command, at)


async def finished(
    store: SqliteStore, command_id: str, at: datetime, state: CommandState = "succeeded"
) -> None:
    """A command delivered, run, logged and finished at ``at``."""
    await submitted(store, command_id, at - timedelta(minutes=5))
    assert await store.mark_delivered(command_id, 1, at, at + DAY) is not None
    assert await store.mark_running(command_id, 1, at, at + DAY) is not None
    await store.append_command_log(command_id, 1, ["one", "two"], at, cap=1 << 20)
    assert await store.finish_command(command_id, 1, state, {}, None, at) is not None


def batches_of(store: SqliteStore, deletion: str, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """What each call of the store's ``deletion`` deletes, in order, from now on."""
    batches: list[int] = []
    delete = getattr(store, deletion)

    async def counted(before: datetime, limit: int) -> int:
        deleted: int = await delete(before, limit)
        batches.append(deleted)
        return deleted

    monkeypatch.setattr(store, deletion, counted)
    return batches


async def log_rows(store: SqliteStore, path: Path) -> int:
    with sqlite3.connect(path) as raw:
        return int(raw.execute("SELECT count(*) FROM command_logs").fetchone()[0])


async def test_finished_commands_older_than_the_cutoff_go_with_their_logs(
    store: SqliteStore, tmp_path: Path
) -> None:
    await finished(store, "old-ok", NOW - 40 * DAY)
    await finished(store, "old-failed", NOW - 35 * DAY, "failed")
    await finished(store, "recent", NOW - 2 * DAY)
    assert await log_rows(store, tmp_path / "state.db") == 6

    assert await store.delete_finished_commands(NOW - 30 * DAY) == 2

    for gone in ("old-ok", "old-failed"):
        with pytest.raises(NotFoundError):
            await store.get_command(gone)
    assert (await store.get_command("recent")).state == "succeeded"
    assert [line.text for line in await store.command_log("recent")] == ["one", "two"]
    assert await log_rows(store, tmp_path / "state.db") == 2


async def test_a_command_not_finished_is_kept_however_old(store: SqliteStore) -> None:
    long_ago = NOW - 400 * DAY
    await submitted(store, "pending", long_ago)
    await submitted(store, "delivered", long_ago)
    await store.mark_delivered("delivered", 1, long_ago, long_ago + DAY)
    await submitted(store, "running", long_ago)
    await store.mark_delivered("running", 1, long_ago, long_ago + DAY)
    await store.mark_running("running", 1, long_ago, long_ago + DAY)

    assert await store.delete_finished_commands(NOW) == 0

    states = [(await store.get_command(name)).state for name in ("pending", "delivered", "running")]
    assert states == ["pending", "delivered", "running"]


async def test_a_command_cancelled_before_delivery_counts_as_finished(store: SqliteStore) -> None:
    await submitted(store, "cancelled", NOW - 40 * DAY)
    await store.request_cancel("cancelled", NOW - 40 * DAY)
    assert await store.delete_finished_commands(NOW - 30 * DAY) == 1


async def test_deletion_takes_the_oldest_first_within_its_limit(store: SqliteStore) -> None:
    for age in (31, 50, 40):
        await finished(store, f"aged-{age}", NOW - age * DAY)
    assert await store.delete_finished_commands(NOW - 30 * DAY, limit=2) == 2
    assert (await store.get_command("aged-31")).state == "succeeded"
    with pytest.raises(NotFoundError):
        await store.get_command("aged-40")


async def test_audit_deletion_takes_the_oldest_first_within_its_limit(store: SqliteStore) -> None:
    for minute in (3, 1, 2, 9):
        await store.add_audit(
            AuditEvent(None, NOW + timedelta(minutes=minute), "ann", None, "proxy", "get")
        )
    assert await store.delete_audit_before(NOW + timedelta(minutes=5), limit=2) == 2
    left = sorted(event.time for event in await store.list_audit())
    assert left == [NOW + timedelta(minutes=3), NOW + timedelta(minutes=9)]


async def test_the_cutoff_query_uses_an_index(tmp_path: Path, store: SqliteStore) -> None:
    with sqlite3.connect(tmp_path / "state.db") as raw:
        plan = raw.execute(
            "EXPLAIN QUERY PLAN SELECT id FROM commands WHERE finished_at < ?"
            " AND state NOT IN ('pending', 'delivered', 'running') ORDER BY finished_at LIMIT 10",
            ("2026-01-01",),
        ).fetchall()
    assert any("commands_finished" in str(row[-1]) for row in plan), plan


async def test_the_pruner_deletes_in_batches_until_nothing_is_past_retention(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    for day in range(5):
        await finished(store, f"old-{day}", NOW - (31 + day) * DAY)
        await store.add_audit(AuditEvent(None, NOW - (91 + day) * DAY, "ann", None, "proxy", "get"))
    await finished(store, "young", NOW - 29 * DAY)
    kept = await store.add_audit(AuditEvent(None, NOW - 89 * DAY, "ann", None, "proxy", "get"))
    calls = batches_of(store, "delete_finished_commands", monkeypatch)
    pruner = Pruner(
        store,
        audit_retention=90 * DAY,
        command_retention=30 * DAY,
        batch=2,
        clock=lambda: NOW,
    )

    assert await pruner.prune() == Pruned(audit_events=5, commands=5, command_log_lines=10)

    assert calls == [2, 2, 1]
    assert [c.id for c in await store.list_commands()] == ["young"]
    assert await store.list_audit() == [kept]
    assert await pruner.prune() == Pruned(audit_events=0, commands=0, command_log_lines=0)


class FailingOnceStore(SqliteStore):
    """Refuses the first pruning as a full disk would, then reports each one made."""

    failed = False
    pruned: asyncio.Queue[int]

    async def delete_finished_commands(self, before: datetime, limit: int = 1000) -> int:
        if not self.failed:
            self.failed = True
            raise StoreError("cannot write the state database: database or disk is full")
        deleted = await super().delete_finished_commands(before, limit)
        self.pruned.put_nowait(deleted)
        return deleted


async def test_the_running_pruner_starts_at_once_and_outlives_a_failure(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = await FailingOnceStore.open(tmp_path / "state.db")
    assert isinstance(store, FailingOnceStore)
    store.pruned = asyncio.Queue()
    try:
        await finished(store, "old", NOW - 40 * DAY)
        pruner = Pruner(
            store, audit_retention=DAY, command_retention=DAY, interval=0, clock=lambda: NOW
        )
        with caplog.at_level(logging.INFO, logger="tunnel_server.retention"):
            async with pruner.running():
                assert await asyncio.wait_for(store.pruned.get(), 10) == 1
                # The next pruning has begun: the one before it has logged what it did.
                assert await asyncio.wait_for(store.pruned.get(), 10) == 0
        assert "cannot prune the store: cannot write the state database" in caplog.text
        # Its log went in the pruning that failed after it (logs go first).
        assert "pruned 0 audit events, and 1 finished commands with 0 log lines" in caplog.text
        assert await store.list_commands() == []
    finally:
        await store.close()


def test_a_retention_under_an_hour_is_refused(store: SqliteStore) -> None:
    with pytest.raises(ValueError, match="audit retention must be at least 1:00:00"):
        Pruner(store, audit_retention=timedelta(minutes=59), command_retention=DAY)
    with pytest.raises(ValueError, match="command retention must be at least 1:00:00"):
        Pruner(store, audit_retention=DAY, command_retention=timedelta(0))


async def test_a_long_log_goes_in_batches_of_lines_before_its_command(
    store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One command's log may hold tens of thousands of lines: no one transaction takes them all."""
    await submitted(store, "chatty", NOW - 40 * DAY)
    await store.mark_delivered("chatty", 1, NOW - 40 * DAY, NOW)
    await store.append_command_log("chatty", 1, [f"line {i}" for i in range(25)], NOW, 1 << 20)
    await store.finish_command("chatty", 1, "succeeded", {}, None, NOW - 40 * DAY)
    batches = batches_of(store, "delete_finished_command_logs", monkeypatch)
    pruner = Pruner(
        store, audit_retention=DAY, command_retention=30 * DAY, batch=10, clock=lambda: NOW
    )
    assert await pruner.prune() == Pruned(audit_events=0, commands=1, command_log_lines=25)
    assert batches == [10, 10, 5]
    assert await log_rows(store, tmp_path / "state.db") == 0


async def test_empty_log_lines_count_against_the_cap(store: SqliteStore) -> None:
    await submitted(store, "blank", NOW)
    await store.mark_delivered("blank", 1, NOW, NOW + DAY)
    kept = await store.append_command_log("blank", 1, [""] * 100, NOW, cap=10)
    assert kept == 10
    record = await store.get_command("blank")
    assert (record.log_bytes, record.log_truncated) == (10, True)
    lines = await store.command_log("blank")
    assert len(lines) == 11  # ten empty lines and the note that the rest was cut
    assert "log truncated" in lines[-1].text
