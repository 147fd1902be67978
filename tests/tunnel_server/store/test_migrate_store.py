"""``tunnel-server migrate-store``: a single server's SQLite state moved to PostgreSQL."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tunnel_server.store.base import AuditEvent, Grant, StoreError, hash_token
from tunnel_server.store.commands import NewCommand
from tunnel_server.store.migrate import move_sqlite_to_postgres
from tunnel_server.store.postgres import PostgresStore
from tunnel_server.store.sqlite import SqliteStore

NOW = datetime(2026, 11, 29, 9, 30, tzinfo=UTC)


async def fill(path: Path) -> None:
    """A state directory's database with a row in every table that moves."""
    store = await SqliteStore.open(path)
    try:
        await store.add_cluster("prod-eu", NOW, "namespaced", ("team-a", "team-b"))
        await store.add_bootstrap_token(hash_token("boot"), "prod-eu", NOW, NOW + timedelta(1))
        await store.record_certificate(2**150 + 7, "prod-eu", "ab" * 32, NOW, NOW + timedelta(30))
        await store.revoke_cluster_certificates("prod-eu", NOW)
        await store.add_user("alice", ("platform", "sre"), False, NOW)
        await store.add_api_token(hash_token("tat_alice"), "alice", NOW, NOW + timedelta(7))
        await store.set_grant(Grant("alice", "prod-eu", ("viewers",), True, False))
        for n in range(3):
            await store.add_audit(
                AuditEvent(None, NOW, "alice", "prod-eu", "admin", f"verb-{n}", "/", 200, detail={})
            )
        record, _ = await store.add_command(
            NewCommand(
                id="c-1",
                cluster="prod-eu",
                submitter="alice",
                type="query",
                name="q",
                spec={"get": {"kind": "Namespace"}},
                max_attempts=2,
                timeout_seconds=60.0,
                idempotency_key="k-1",
            ),
            NOW,
            100,
        )
        await store.mark_delivered(record.id, 1, NOW, NOW + timedelta(minutes=1))
        await store.append_command_log(record.id, 1, ["one", "two"], NOW, 10_000)
    finally:
        await store.close()


async def test_every_row_moves_once_and_a_second_run_adds_only_what_is_new(
    tmp_path: Path, postgres_url: str
) -> None:
    state = tmp_path / "state.db"
    await fill(state)
    moved = {table.table: table for table in await move_sqlite_to_postgres(state, postgres_url)}
    assert all(table.verified == table.source_rows for table in moved.values())
    assert moved["audit"].added == 3
    assert moved["command_logs"].added == 2
    target = await PostgresStore.open(postgres_url)
    try:
        cluster = await target.get_cluster("prod-eu")
        assert (cluster.rbac, cluster.namespaces) == ("namespaced", ("team-a", "team-b"))
        assert 2**150 + 7 in await target.revoked_serials()
        user = await target.find_user_by_token(hash_token("tat_alice"), NOW)
        assert user is not None
        assert user.groups == ("platform", "sre")
        grant = await target.get_grant("alice", "prod-eu")
        assert (grant.as_groups, grant.commands) == (("viewers",), True)
        command = await target.get_command("c-1")
        assert (command.state, command.attempt, command.spec) == (
            "delivered",
            1,
            {"get": {"kind": "Namespace"}},
        )
        assert [line.text for line in await target.command_log("c-1")] == ["one", "two"]
        # New rows after the move take ids after the moved ones.
        added = await target.add_audit(
            AuditEvent(None, NOW, None, None, "admin", "after", "/", 200, detail={})
        )
        assert added.id is not None
        assert added.id > 3
    finally:
        await target.close()

    again = await move_sqlite_to_postgres(state, postgres_url)
    assert {table.added for table in again} == {0}
    assert all(table.verified == table.source_rows for table in again)


async def test_a_state_directory_without_a_database_is_refused_by_name(
    tmp_path: Path, postgres_url: str
) -> None:
    with pytest.raises(StoreError, match="no SQLite state database"):
        await move_sqlite_to_postgres(tmp_path / "state.db", postgres_url)


async def test_the_command_moves_a_state_directory_and_says_what_it_verified(
    tmp_path: Path, postgres_url: str
) -> None:
    await fill(tmp_path / "state.db")
    run = await asyncio.to_thread(
        subprocess.run,
        [
            str(Path(sys.executable).parent / "tunnel-server"),
            "migrate-store",
            "--from",
            str(tmp_path),
            "--to",
            postgres_url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    lines = {line.split()[0]: line.split()[1:] for line in run.stdout.splitlines()}
    assert lines["clusters"][0] == "1"
    assert lines["audit"][:4] == ["3", "rows", "3", "new"]
    assert "verified: every row" in run.stdout
