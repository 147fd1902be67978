"""Three real replicas on one PostgreSQL database, behind a balancer, with real agents.

Requests and commands go in at any replica and reach the cluster whose agent
holds its socket on another; a newer session fences an older one across
replicas; a revocation made on one replica ends a request held on another;
an agent whose replica stops moves to another and serves again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from protocol import kinds
from tunnel_agent.config import AgentSettings
from tunnel_agent.kubeproxy import KubeProxy
from tunnel_agent.policy import ProxyPolicy
from tunnel_agent.router import StreamRouter
from tunnel_pki.tls import client_context
from tunnel_server.clock import utcnow
from tunnel_server.store.postgres import PostgresStore

from ..support import until
from .commands_support import Script, command, command_agent
from .harness import RunningAgent, RunningServer, agent_settings, running_agent
from .replicas import Fleet, running_fleet
from .test_kubeproxy_relay import agent_kube_api
from .upstream import Upstream, running_upstream

CLUSTER = "prod-eu"
#: Event-loop turns to wait for what crosses the database (a notification, a claim).
PATIENCE = 2_000_000


@dataclass
class Cluster:
    fleet: Fleet
    upstream: Upstream
    agent: RunningAgent
    settings: AgentSettings
    token: str

    def owner(self) -> RunningServer | None:
        held = [r for r in self.fleet.replicas if r.context.registry.get(CLUSTER) is not None]
        return held[0] if len(held) == 1 else None

    def others(self) -> list[RunningServer]:
        owner = self.owner()
        return [replica for replica in self.fleet.replicas if replica is not owner]

    async def call(
        self, replica: RunningServer, path: str, http: aiohttp.ClientSession
    ) -> tuple[int, Any]:
        async with http.get(
            f"{replica.url}/k8s/clusters/{CLUSTER}{path}",
            headers={"Authorization": f"Bearer {self.token}"},
            ssl=client_context(self.fleet.ca_pem),
        ) as response:
            text = await response.text()
            try:
                return response.status, json.loads(text)
            except ValueError:
                return response.status, text


def fleet_agent(fleet: Fleet, token: str | None, credentials: Path) -> AgentSettings:
    """An agent that knows only the balancer's address."""
    settings = agent_settings(fleet.replicas[0], CLUSTER, token, credentials)
    return dataclasses.replace(settings, server_url=fleet.url, ca_pem=fleet.ca_pem)


@contextlib.asynccontextmanager
async def served_cluster(fleet: Fleet, tmp_path: Path) -> AsyncIterator[Cluster]:
    """Cluster prod-eu behind one agent (on whichever replica the balancer chose), and
    user alice granted it."""
    first = fleet.replicas[0]
    bootstrap = await first.add_cluster(CLUSTER)
    status, answer = await first.api("POST", "/api/v1/users", {"name": "alice"})
    assert status == 201, answer
    status, _ = await first.api("PUT", f"/api/v1/grants/alice/{CLUSTER}", {})
    assert status == 200
    async with running_upstream() as upstream:
        api = agent_kube_api(upstream)
        proxy = KubeProxy(api, ProxyPolicy())
        router = StreamRouter()
        router.add(kinds.STREAM_HTTP, proxy.handle)
        settings = fleet_agent(fleet, bootstrap, tmp_path / "creds")
        async with running_agent(settings, on_stream=router) as agent:
            await agent.wait_connected()
            cluster = Cluster(fleet, upstream, agent, settings, answer["token"])
            await until(lambda: cluster.owner() is not None)
            yield cluster
        await proxy.close()
        await api.close()


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    async with running_fleet(tmp_path) as running:
        yield running


@pytest.fixture
async def cluster(fleet: Fleet, tmp_path: Path) -> AsyncIterator[Cluster]:
    async with served_cluster(fleet, tmp_path) as served:
        yield served


async def test_every_replica_relays_to_the_replica_that_holds_the_agent(
    cluster: Cluster,
) -> None:
    owner = cluster.owner()
    assert owner is not None
    async with aiohttp.ClientSession() as http:
        for replica in cluster.fleet.replicas:
            status, body = await cluster.call(replica, "/api/v1/namespaces?from=x", http)
            assert status == 200, body
            assert body["path"] == "/api/v1/namespaces?from=x"
            _, _, headers = cluster.upstream.requests[-1]
            assert headers["Impersonate-User"] == "tunnel:alice"
            assert cluster.token not in str(dict(headers))
    # Authenticated once, where received: the owner saw one link per other replica.
    for replica in cluster.others():
        assert replica.context.links is not None
        assert replica.context.links.dialed == 1


async def test_the_audit_says_which_replica_received_and_which_served(
    cluster: Cluster,
) -> None:
    owner = cluster.owner()
    receiver = cluster.others()[0]
    assert owner is not None
    async with aiohttp.ClientSession() as http:
        status, _ = await cluster.call(receiver, "/api/v1/pods", http)
    assert status == 200
    await receiver.context.audit.flush()

    def forwarded(event: dict[str, Any]) -> bool:
        return bool(event["kind"] == "proxy" and event["path"] == "/api/v1/pods")

    status, events = await receiver.api("GET", f"/api/v1/audit?cluster={CLUSTER}")
    assert status == 200
    [event] = [event for event in events if forwarded(event)]
    assert event["detail"]["replica"] == {
        "received": receiver.settings.replica.name,
        "served": owner.settings.replica.name,
    }


async def test_a_request_held_on_one_replica_ends_when_its_grant_is_revoked_on_another(
    cluster: Cluster,
) -> None:
    receiver, revoker = cluster.others()
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            f"{receiver.url}/k8s/clusters/{CLUSTER}/api/v1/stream",
            headers={"Authorization": f"Bearer {cluster.token}"},
            ssl=client_context(cluster.fleet.ca_pem),
        ) as response,
    ):
        assert response.status == 200
        await cluster.upstream.stream_lines.put(b'{"line": 1}\n')
        assert await response.content.readline() == b'{"line": 1}\n'
        status, _ = await revoker.api("DELETE", f"/api/v1/grants/alice/{CLUSTER}")
        assert status in (200, 204)
        # Cut by the receiving replica, which heard of it from the database.
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.content.read()
    assert len(receiver.context.live) == 0


async def test_commands_submitted_on_any_replica_run_exactly_once(
    fleet: Fleet, tmp_path: Path
) -> None:
    first = fleet.replicas[0]
    bootstrap = await first.add_cluster(CLUSTER)
    script = Script()
    settings = fleet_agent(fleet, bootstrap, tmp_path / "creds")
    async with command_agent(settings, script, concurrency=4) as (agent, _):
        await agent.wait_connected()
        submitted: list[str] = []
        for index in range(30):
            replica = fleet.replicas[index % 3]
            status, answer = await replica.api(
                "POST", f"/api/v1/clusters/{CLUSTER}/commands", {"spec": command(f"ok-{index}")}
            )
            assert status == 201, answer
            submitted.append(answer["id"])
        # Followed on a replica that may hold neither the agent nor the submission.
        watcher = fleet.replicas[2]
        for command_id in submitted:
            while True:
                status, record = await watcher.api("GET", f"/api/v1/commands/{command_id}")
                assert status == 200
                if record["state"] not in ("pending", "delivered", "running"):
                    break
                await watcher.context.commands.wait_change(command_id, patience=5.0)
            assert record["state"] == "succeeded", record
    assert sorted(command_id for command_id, _ in script.runs) == sorted(submitted)


async def test_a_newer_session_on_another_replica_fences_the_older_one(
    fleet: Fleet, tmp_path: Path
) -> None:
    a, b, _ = fleet.replicas
    bootstrap = await a.add_cluster(CLUSTER)
    first = agent_settings(a, CLUSTER, bootstrap, tmp_path / "first")
    first = dataclasses.replace(first, ca_pem=fleet.ca_pem)
    closed = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []

    def on_disconnected() -> None:
        # Stops the older agent before it can dial again and take the cluster back.
        closed.set()
        tasks[0].cancel()

    async with running_agent(first, on_disconnected=on_disconnected) as older:
        tasks.append(older.task)
        await older.wait_connected()
        await until(lambda: a.context.registry.get(CLUSTER) is not None)
        older_epoch = a.context.registry.get(CLUSTER).epoch  # type: ignore[union-attr]
        # The same agent's key, connecting to another replica (a restarted pod, say).
        shutil.copytree(tmp_path / "first", tmp_path / "second")
        second = agent_settings(b, CLUSTER, None, tmp_path / "second")
        second = dataclasses.replace(second, ca_pem=fleet.ca_pem)
        async with running_agent(second) as newer:
            await newer.wait_connected()
            await closed.wait()  # A closed its session when it heard of B's claim
            await older.stop()
            held = b.context.registry.get(CLUSTER)
            assert held is not None
            assert held.epoch > older_epoch
            store = b.context.store
            assert isinstance(store, PostgresStore)
            owner = await store.session_owner(CLUSTER, utcnow())
            assert owner is not None
            assert (owner.replica, owner.epoch) == ("b", held.epoch)


async def test_an_agent_whose_replica_stops_serves_again_from_another(
    cluster: Cluster,
) -> None:
    owner = cluster.owner()
    assert owner is not None
    await owner.stop()  # GOAWAY to its agents; they reconnect through the balancer
    survivors = [replica for replica in cluster.fleet.replicas if replica is not owner]
    await until(lambda: cluster.owner() not in (None, owner), max_turns=PATIENCE)
    async with aiohttp.ClientSession() as http:
        for replica in survivors:
            status, body = await cluster.call(replica, "/api/v1/nodes", http)
            assert status == 200, body
    replicas = await survivors[0].context.replicas.replicas()
    assert owner.settings.replica.name not in {replica.name for replica in replicas}


async def test_a_cluster_revoked_on_one_replica_is_cut_off_on_the_replica_holding_it(
    cluster: Cluster,
) -> None:
    owner = cluster.owner()
    assert owner is not None
    other = cluster.others()[0]
    status, answer = await other.api("POST", f"/api/v1/clusters/{CLUSTER}/revoke")
    assert status == 200, answer
    # The owner heard of it from the database: the session is closed, and the agent's
    # certificate is refused by every replica it may reconnect to.
    await until(lambda: owner.context.registry.get(CLUSTER) is None, max_turns=PATIENCE)
    await until(
        lambda: all(len(r.context.revoked) == 1 for r in cluster.fleet.replicas),
        max_turns=PATIENCE,
    )
    assert cluster.owner() is None
