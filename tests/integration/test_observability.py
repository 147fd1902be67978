"""Metrics and fleet status reflect what happened, with bounded labels."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tunnel_agent.errors import BootstrapRefusedError
from tunnel_agent.health import start_health_server
from tunnel_pki.tls import client_context

from ..support import until
from .harness import RunningServer, agent_settings, running_agent


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


async def server_metrics(
    server: RunningServer,
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(server.url + "/metrics", ssl=client_context(server.ca_pem)) as response,
    ):
        assert response.status == 200
        return samples(await response.text())


async def test_server_metrics_count_sessions_bootstraps_and_refusals(
    server: RunningServer, tmp_path: Path
) -> None:
    token = await server.add_cluster("prod-eu")
    async with running_agent(agent_settings(server, "prod-eu", token, tmp_path / "c")) as agent:
        await agent.wait_connected()
        found = await server_metrics(server)
        assert found[("tunnel_server_sessions", ())] == 1
        assert found[("tunnel_server_clusters_connected", ())] == 1
        assert found[("tunnel_server_agent_connects_total", ())] == 1
        assert found[("tunnel_server_bootstraps_total", (("outcome", "issued"),))] == 1
    # A second bootstrap with the spent token is refused and counted by reason.
    async with running_agent(agent_settings(server, "prod-eu", token, tmp_path / "d")) as again:
        with pytest.raises(BootstrapRefusedError):
            await again.task
    found = await server_metrics(server)
    assert found[("tunnel_server_bootstraps_total", (("outcome", "token_used"),))] == 1
    assert found[("tunnel_server_sessions", ())] == 0
    # Counters of the ended session were kept, not dropped.
    assert found[("tunnel_server_stream_opens_total", ())] >= 0
    assert all("prod-eu" not in str(labels) for (_, labels) in found)


async def test_agent_metrics_and_fleet_status(server: RunningServer, tmp_path: Path) -> None:
    token = await server.add_cluster("prod-eu")
    await server.add_cluster("staging")
    async with running_agent(agent_settings(server, "prod-eu", token, tmp_path / "c")) as running:
        await running.wait_connected()
        session = running.agent.session
        assert session is not None
        await until(lambda: session.connection.min_rtt is not None, max_turns=100_000)
        runner, port = await start_health_server(running.agent, "127.0.0.1", 0)
        try:
            async with (
                aiohttp.ClientSession() as http,
                http.get(f"http://127.0.0.1:{port}/metrics") as response,
            ):
                found = samples(await response.text())
        finally:
            await runner.cleanup()
        assert found[("tunnel_agent_connected", ())] == 1
        assert found[("tunnel_agent_connections_total", ())] == 1
        assert found[("tunnel_agent_sessions", ())] == 1
        # Measured once the handshake completed: it sizes credit while streams share.
        assert found[("tunnel_agent_smallest_rtt_seconds", (("stat", "max"),))] > 0
        status, answer = await server.api("GET", "/api/v1/status")
    assert status == 200
    assert answer["clusters"] == {"total": 2, "connected": 1, "disconnected": ["staging"]}
    assert answer["agents_out_of_date"] == []
    assert answer["commands"]["running"] == 0


async def test_the_server_sets_a_smaller_tls_read_buffer(server: RunningServer) -> None:
    """The per-connection TLS buffer that dominates an idle agent's memory is bounded."""
    import asyncio.sslproto

    assert asyncio.sslproto.SSLProtocol.max_size == server.settings.tunnel.tls_read_buffer
    assert server.settings.tunnel.tls_read_buffer == 64 * 1024


async def test_proxied_requests_are_counted_by_verb_and_code(server: RunningServer) -> None:
    await server.add_cluster("prod-eu")  # never connected: every request gets 503 at once
    status, _ = await server.api("PUT", "/api/v1/grants/admin/prod-eu", {})
    assert status == 200
    base = f"{server.url}/k8s/clusters/prod-eu"
    headers = {"Authorization": f"Bearer {server.admin_token}"}
    async with aiohttp.ClientSession() as http:
        for method, path in [
            ("GET", "/api/v1/pods"),
            ("GET", "/api/v1/namespaces/default/pods"),
            ("GET", "/api/v1/namespaces/default/pods/web"),
            ("PROPFIND", "/api/v1/pods"),
        ]:
            async with http.request(
                method, base + path, headers=headers, ssl=client_context(server.ca_pem)
            ) as response:
                assert response.status == 503
    found = await server_metrics(server)
    counts = "tunnel_server_proxy_requests_total"
    assert found[(counts, (("code", "503"), ("verb", "list")))] == 2
    assert found[(counts, (("code", "503"), ("verb", "get")))] == 1
    assert found[(counts, (("code", "503"), ("verb", "other")))] == 1
    durations = "tunnel_server_proxy_request_duration_seconds_count"
    assert found[(durations, (("verb", "list"),))] == 2
    assert found[(durations, (("verb", "get"),))] == 1
