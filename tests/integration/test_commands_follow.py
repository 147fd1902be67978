"""Following a command's log: it always ends, says why when it cannot go on, and keeps alive.

Each case hung or misled a follower before (found by a review of the command path): a store
failure or a pruning mid-follow left the stream open with nothing more to come, a change
landing between the follower's read and its wait went unseen for 15 s, and a quiet command
let idle timeouts cut the stream.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from tunnel_pki.tls import client_context
from tunnel_server.clock import utcnow
from tunnel_server.commands import api as commands_api
from tunnel_server.store import StoreError

from ..support import until
from .commands_support import command, log_records, records_of
from .harness import RunningServer
from .test_commands_delivery import submit


@pytest.fixture
async def pending(server: RunningServer) -> dict[str, Any]:
    """A command on a cluster whose agent never comes: it stays pending."""
    await server.add_cluster("prod-eu")
    return await submit(server, command("never"))


async def test_a_store_failure_mid_follow_ends_the_stream_saying_so(
    server: RunningServer, pending: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = server.context.store
    read_log = store.command_log
    reads = 0

    async def fails_the_second_time(*args: Any, **kwargs: Any) -> Any:
        nonlocal reads
        reads += 1
        if reads == 2:
            raise StoreError("the state database is locked by another process; retry later")
        return await read_log(*args, **kwargs)

    monkeypatch.setattr(store, "command_log", fails_the_second_time)
    monkeypatch.setattr(commands_api, "FOLLOW_PATIENCE", 0.01)
    records = await asyncio.wait_for(records_of(server, pending["id"]), 30)
    assert records[-1] == {
        "error": "the server could not read the log: the state database is locked by another"
        " process; retry later; follow again to go on"
    }


async def test_a_command_pruned_while_followed_ends_the_stream_saying_so(
    server: RunningServer, pending: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    await server.context.commands.cancel(pending["id"], "admin")
    store = server.context.store
    read_state = store.get_command

    reads = 0

    async def pruned_after_the_access_check(command_id: str) -> Any:
        nonlocal reads
        reads += 1
        if reads == 2:  # the first read found it and let the caller in
            await store.delete_finished_commands(utcnow() + timedelta(days=400), 1000)
        return await read_state(command_id)

    monkeypatch.setattr(store, "get_command", pruned_after_the_access_check)
    records = await asyncio.wait_for(records_of(server, pending["id"], "after=0"), 30)
    assert records == [
        {"error": f"command {pending['id']} was deleted while being read (its retention passed)"}
    ]


async def test_a_change_between_the_read_and_the_wait_is_not_missed(
    server: RunningServer, pending: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A patience longer than the test's own bound: only the change can end the follow in time.
    monkeypatch.setattr(commands_api, "FOLLOW_PATIENCE", 3600.0)
    store = server.context.store
    read_log = store.command_log
    reads = 0

    async def cancelled_just_after_the_first_read(*args: Any, **kwargs: Any) -> Any:
        nonlocal reads
        lines = await read_log(*args, **kwargs)
        reads += 1
        if reads == 1:  # the state was read as pending; now it changes, before the wait
            await server.context.commands.cancel(pending["id"], "admin")
        return lines

    monkeypatch.setattr(store, "command_log", cancelled_just_after_the_first_read)
    records = await asyncio.wait_for(records_of(server, pending["id"]), 30)
    assert records[-1]["command"]["state"] == "cancelled"


async def test_a_quiet_follow_sends_keepalives_until_the_outcome(
    server: RunningServer, pending: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(commands_api, "FOLLOW_PATIENCE", 0.01)
    seen: list[Any] = []
    async for record in log_records(server, pending["id"]):
        seen.append(record)
        if record == {"keepalive": True} and len(seen) == 2:
            await server.context.commands.cancel(pending["id"], "admin")
    assert seen[:2] == [{"keepalive": True}, {"keepalive": True}]
    assert seen[-1]["command"]["state"] == "cancelled"


@pytest.mark.parametrize("after", ["-5", "99999999999999999999", "1_0", "x"])
async def test_a_log_position_out_of_range_is_refused(
    server: RunningServer, pending: dict[str, Any], after: str
) -> None:
    status, answer = await server.api("GET", f"/api/v1/commands/{pending['id']}/logs?after={after}")
    assert status == 400
    assert "after must be a log line's number" in answer["error"]["message"]


async def test_one_user_follows_a_bounded_number_of_logs_at_once(
    server: RunningServer, pending: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each follow holds a connection for as long as its command runs (found by a review:
    eight follows of a command that never ends took every caller connection)."""
    monkeypatch.setattr(commands_api, "MAX_FOLLOWS_PER_USER", 2)
    assert server._http is not None
    url = f"{server.url}/api/v1/commands/{pending['id']}/logs?follow=1"
    options: dict[str, Any] = {
        "headers": {"Authorization": f"Bearer {server.admin_token}"},
        "ssl": client_context(server.ca_pem),
    }
    first = await server._http.get(url, **options)
    second = await server._http.get(url, **options)
    try:
        assert (first.status, second.status) == (200, 200)
        status, answer = await server.api("GET", f"/api/v1/commands/{pending['id']}/logs?follow=1")
        assert status == 429
        assert answer["error"]["message"] == (
            "user admin already follows 2 command logs, the most one user may;"
            " end one, or read without --follow"
        )
        # Reading without following is not counted.
        status, _ = await server.api("GET", f"/api/v1/commands/{pending['id']}/logs")
        assert status == 200
    finally:
        first.close()
    await until(lambda: server.context.commands.follows["admin"] == 1, max_turns=10**6)
    third = await server._http.get(url, **options)
    try:
        assert third.status == 200
    finally:
        third.close()
        second.close()
