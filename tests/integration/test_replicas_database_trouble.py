"""Replicas whose PostgreSQL server goes away and comes back (a private server, restarted).

While it is away: readiness is false with the reason, what needs the
database is answered 503 saying why, and nothing is half-written. When it is
back, everything resumes by itself: the agent kept its session, commands
submitted before the outage finish, new ones run.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.pgserver import PrivatePostgres, private_postgres
from tunnel_pki.tls import client_context

from .commands_support import Script, command, command_agent
from .harness import RunningServer
from .replicas import Fleet, running_fleet
from .test_replicas import CLUSTER, fleet_agent

pytestmark = pytest.mark.timeout(120)


async def readiness(replica: RunningServer) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{replica.url}/readyz", ssl=client_context(replica.ca_pem)) as response,
    ):
        return response.status, await response.text()


async def until_ready(replica: RunningServer, ready: bool) -> str:
    """Ask the replica's readiness until it says ``ready`` (each ask is a real round trip
    to the database); what it said last."""
    while True:
        status, text = await readiness(replica)
        if (status == 200) == ready:
            return text


@pytest.fixture
async def database() -> AsyncIterator[PrivatePostgres]:
    async with private_postgres() as server:
        yield server


@pytest.fixture
async def fleet(tmp_path: Path, database: PrivatePostgres) -> AsyncIterator[Fleet]:
    # A lease longer than the outage: the replicas keep their sessions through it.
    async with running_fleet(tmp_path, 2, server=database.url, lease=30.0) as running:
        yield running


async def test_an_outage_is_reported_and_everything_resumes_when_the_database_returns(
    fleet: Fleet, database: PrivatePostgres, tmp_path: Path
) -> None:
    first, second = fleet.replicas
    bootstrap = await first.add_cluster(CLUSTER)
    script = Script()
    async with command_agent(fleet_agent(fleet, bootstrap, tmp_path / "creds"), script) as (
        agent,
        _,
    ):
        await agent.wait_connected()
        status, before = await second.api(
            "POST", f"/api/v1/clusters/{CLUSTER}/commands", {"spec": command("gate-before")}
        )
        assert status == 201, before
        await script.started.get()  # running on the agent when the database goes

        await database.stop()
        for replica in fleet.replicas:
            said = await until_ready(replica, ready=False)
            assert "not ready" in said
        status, refused = await second.api(
            "POST", f"/api/v1/clusters/{CLUSTER}/commands", {"spec": command("ok-during")}
        )
        assert status == 503, refused
        assert refused["error"]["message"] == "the server's store is unavailable"
        script.gate.set()  # the command ends while the database is away

        await database.start()
        for replica in fleet.replicas:
            await until_ready(replica, ready=True)
        # The agent's session outlived the outage; its report of the result goes
        # through once the database is back (the agent keeps it until acknowledged).
        while True:
            status, record = await first.api("GET", f"/api/v1/commands/{before['id']}")
            if status == 200 and record["state"] == "succeeded":
                break
            await first.context.commands.wait_change(before["id"], patience=1.0)
        status, after = await first.api(
            "POST", f"/api/v1/clusters/{CLUSTER}/commands", {"spec": command("ok-after")}
        )
        assert status == 201, after
        while True:
            status, record = await second.api("GET", f"/api/v1/commands/{after['id']}")
            assert status == 200
            if record["state"] not in ("pending", "delivered", "running"):
                break
            await second.context.commands.wait_change(after["id"], patience=1.0)
        assert record["state"] == "succeeded"
    # Ran once each, and the one refused during the outage never existed.
    assert [name for name, _ in script.runs] == [before["id"], after["id"]]
