"""A flood of connections that never finish their TLS handshake keeps no one out.

Found by trying it: when a handshake slot was taken at accept, 64 connections
that said nothing kept every caller and every agent out of the server until
their 10 s deadline, for as long as they were renewed.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from tunnel_server.app import LISTENER

from ..slow_clients import close_all, raw_connection, stalled_after_client_hello
from ..support import until
from .harness import agent_settings, running_agent, running_server, server_settings
from .test_observability import server_metrics


async def test_agents_and_callers_get_through_a_flood_of_stalled_handshakes(
    tmp_path: Path,
) -> None:
    base = server_settings(tmp_path / "state")
    tunnel = dataclasses.replace(base.tunnel, tls_handshake_timeout=60.0, tls_handshake_grace=0.2)
    async with running_server(dataclasses.replace(base, tunnel=tunnel)) as server:
        token = await server.add_cluster("prod-eu")
        admission = server.runner.app[LISTENER].admission
        silent = [await raw_connection(server.port, "127.0.0.2") for _ in range(100)]
        stalled = [
            await stalled_after_client_hello(server.port, server.ca_pem, "127.0.0.2")
            for _ in range(admission.handshakes + 6)
        ]
        await until(lambda: admission.in_progress == admission.handshakes)

        settings = agent_settings(server, "prod-eu", token, tmp_path / "creds")
        async with running_agent(settings) as agent:  # bootstraps, then connects
            await asyncio.wait_for(agent.wait_connected(), 30)
            assert (await server.cluster("prod-eu"))["connected"] is True

        metrics = await server_metrics(server)
        assert metrics[("tunnel_server_tls_connections_waiting", (("for", "client_hello"),))] == 100
        abandoned = (("reason", "abandoned"),)
        assert metrics[("tunnel_server_tls_connections_dropped_total", abandoned)] >= 3
        assert metrics[("tunnel_server_tls_handshakes_limit", ())] == admission.handshakes
        assert metrics[("tunnel_server_tls_handshake_seconds_count", ())] >= 3
        await close_all(*silent, *stalled)
