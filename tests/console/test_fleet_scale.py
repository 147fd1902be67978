"""A fleet of 2,000 clusters: the page is served in under a second, and its live stream
sends the whole fleet once, then only what changed."""

from __future__ import annotations

import time

import pytest

from tests.console.support import ConsoleClient
from tests.integration.harness import RunningServer
from tunnel_server.clock import utcnow
from tunnel_server.console.state import CONSOLE

CLUSTERS = 2000


@pytest.fixture
async def big(server: RunningServer) -> RunningServer:
    store = server.context.store
    now = utcnow()
    for number in range(CLUSTERS):
        await store.add_cluster(f"cluster-{number:04d}", now)
    return server


@pytest.mark.timeout(300)
async def test_two_thousand_clusters_are_served_in_under_a_second(
    big: RunningServer, client: ConsoleClient
) -> None:
    await client.sign_in(big.admin_token)
    await client.get("/ui/")  # the templates compiled, the connection's costs paid once
    started = time.perf_counter()
    page = await client.get("/ui/?sort=name&order=desc")
    elapsed = time.perf_counter() - started
    assert page.status == 200
    assert page.text.count("<tr data-name=") == CLUSTERS
    assert elapsed < 1.0, f"the fleet page took {elapsed:.2f}s"


@pytest.mark.timeout(300)
async def test_the_live_stream_sends_the_fleet_once_then_changes_only(
    big: RunningServer, client: ConsoleClient
) -> None:
    big.runner.app[CONSOLE].poll_interval = 0.05
    await client.sign_in(big.admin_token)
    async with client.events("/ui/events/fleet") as events:
        first = await events.until("fleet")
        assert first["full"]
        assert len(first["rows"]) == CLUSTERS
        await big.context.store.add_cluster("newcomer", utcnow())
        update = await events.until("fleet")
        assert [row["name"] for row in update["rows"]] == ["newcomer"]
        assert not update["full"]
