"""Leases are judged only once the cluster's agent could have resumed its commands.

One agent runs a cluster's commands. A lease that ran out while that agent is
away (or while the server itself was down) says nothing about the command:
the agent may still be running it and resume its reports when it dials
again. So a connected agent's leases are judged a lease after it connected,
and the others only after the return grace.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest

from tunnel_server.agents.registry import AgentConnection, AgentRegistry
from tunnel_server.audit import AuditWriter
from tunnel_server.commands.dispatcher import CommandDispatcher
from tunnel_server.config import CommandSettings
from tunnel_server.store import SqliteStore
from tunnel_server.store.commands import NewCommand

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
LONG_AGO = NOW - timedelta(days=1)
LEASE = 30.0
GRACE = 360.0


@dataclass
class OpenSession:
    """An agent's session: open, its peer last heard from ``silent`` seconds ago."""

    silent: float | None = 0.0
    is_open: bool = True

    def silent_for(self) -> float | None:
        return self.silent


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    store = await SqliteStore.open(tmp_path / "state.db")
    yield store
    await store.close()


@pytest.fixture
def registry() -> AgentRegistry:
    return AgentRegistry(replace_grace=1.0)


@pytest.fixture
def dispatcher(store: SqliteStore, registry: AgentRegistry) -> CommandDispatcher:
    settings = CommandSettings(lease=LEASE, agent_return_grace=GRACE)
    return CommandDispatcher(store, registry, AuditWriter(store), settings, access=cast(Any, None))


async def running(
    store: SqliteStore, command_id: str, cluster: str, lease_until: datetime, attempts: int = 1
) -> None:
    """A command whose attempt 1 runs on the agent, with its lease until ``lease_until``."""
    command = NewCommand(command_id, cluster, "ann", "query", command_id, {}, attempts, 60.0)
    await store.add_command(command, LONG_AGO)
    assert await store.mark_delivered(command_id, 1, LONG_AGO, lease_until) is not None
    assert await store.mark_running(command_id, 1, LONG_AGO, lease_until) is not None


def connect(
    registry: AgentRegistry, cluster: str, since: datetime, silent: float | None = 0.0
) -> OpenSession:
    """The cluster's agent, connected since ``since`` and heard ``silent`` seconds ago."""
    session = OpenSession(silent)
    registry.attach(AgentConnection(cluster, cast(Any, session), 1, None, None, since))
    return session


async def state_of(store: SqliteStore, command_id: str) -> str:
    return (await store.get_command(command_id)).state


async def test_an_absent_agent_gets_the_return_grace_after_its_lease(
    store: SqliteStore, dispatcher: CommandDispatcher
) -> None:
    ran_out = NOW - timedelta(seconds=1)
    await running(store, "c1", "prod", ran_out)
    # The agent is not connected: it may be dialling again, still running c1.
    assert await dispatcher.reap(NOW, LONG_AGO) == []
    assert await dispatcher.reap(ran_out + timedelta(seconds=GRACE - 1), LONG_AGO) == []
    assert await state_of(store, "c1") == "running"
    [lapsed] = await dispatcher.reap(ran_out + timedelta(seconds=GRACE + 1), LONG_AGO)
    assert (lapsed.command.id, lapsed.command.state) == ("c1", "lost")
    assert lapsed.command.error == "the agent was lost during attempt 1 of 1"


async def test_a_server_that_was_down_gives_its_agents_the_grace_from_its_start(
    store: SqliteStore, dispatcher: CommandDispatcher
) -> None:
    # The lease ran out a day ago, while this server was down; it starts now.
    await running(store, "c1", "prod", LONG_AGO + timedelta(seconds=LEASE))
    assert await dispatcher.reap(NOW + timedelta(seconds=LEASE * 2), NOW) == []
    assert await dispatcher.reap(NOW + timedelta(seconds=GRACE - 1), NOW) == []
    assert await state_of(store, "c1") == "running"
    [lapsed] = await dispatcher.reap(NOW + timedelta(seconds=GRACE), NOW)
    assert lapsed.command.state == "lost"


async def test_a_connected_agent_has_one_lease_to_resume_then_its_leases_are_judged(
    store: SqliteStore, registry: AgentRegistry, dispatcher: CommandDispatcher
) -> None:
    await running(store, "c1", "prod", NOW - timedelta(minutes=1), attempts=2)
    connect(registry, "prod", NOW - timedelta(seconds=10))
    # Back 10 s ago: it has until a lease after it connected to report c1.
    assert await dispatcher.reap(NOW, LONG_AGO) == []
    assert await dispatcher.reap(NOW + timedelta(seconds=LEASE - 11), LONG_AGO) == []
    [lapsed] = await dispatcher.reap(NOW + timedelta(seconds=LEASE - 10), LONG_AGO)
    # It did not: the agent that is back does not run attempt 1; attempt 2 may go.
    assert (lapsed.command.state, lapsed.requeued) == ("pending", True)


async def test_a_connected_agent_not_heard_from_since_the_lease_ran_out_is_not_judged_on(
    store: SqliteStore, registry: AgentRegistry, dispatcher: CommandDispatcher
) -> None:
    # A link gone dead without a close stays registered until its keepalive
    # fails (up to 30 s): the agent may be dialling again, still running c1.
    await running(store, "c1", "prod", NOW - timedelta(seconds=2))
    session = connect(registry, "prod", LONG_AGO, silent=10.0)
    assert await dispatcher.reap(NOW, LONG_AGO) == []
    session.silent = 3.0  # heard from just before the lease ran out: still no news
    assert await dispatcher.reap(NOW, LONG_AGO) == []
    session.silent = None  # nothing heard on this connection yet
    assert await dispatcher.reap(NOW, LONG_AGO) == []
    assert await state_of(store, "c1") == "running"
    session.silent = 1.0  # heard from since: it is there, and c1 is not
    [lapsed] = await dispatcher.reap(NOW, LONG_AGO)
    assert lapsed.command.state == "lost"


async def test_each_cluster_is_judged_by_its_own_agent(
    store: SqliteStore, registry: AgentRegistry, dispatcher: CommandDispatcher
) -> None:
    ran_out = NOW - timedelta(seconds=5)
    await running(store, "on-settled", "settled", ran_out)
    await running(store, "on-new", "new", ran_out)
    await running(store, "on-away", "away", ran_out)
    connect(registry, "settled", NOW - timedelta(hours=1))
    connect(registry, "new", NOW - timedelta(seconds=1))
    lapsed = await dispatcher.reap(NOW, LONG_AGO)
    assert [item.command.id for item in lapsed] == ["on-settled"]
    assert await state_of(store, "on-new") == "running"
    assert await state_of(store, "on-away") == "running"


async def test_a_lease_not_run_out_is_never_judged(
    store: SqliteStore, registry: AgentRegistry, dispatcher: CommandDispatcher
) -> None:
    await running(store, "c1", "prod", NOW + timedelta(seconds=1))
    connect(registry, "prod", LONG_AGO)
    assert await dispatcher.reap(NOW, LONG_AGO - timedelta(days=1)) == []
    assert await state_of(store, "c1") == "running"
