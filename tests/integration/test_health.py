"""The agent's probes: /healthz while it runs, /readyz only while it is connected."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp

from tunnel_agent.connector import Agent
from tunnel_agent.credentials import DirectoryCredentialStore
from tunnel_agent.health import start_health_server

from ..support import until
from .harness import RunningServer, agent_settings, running_agent


class Probes:
    """GETs against the agent's health port."""

    def __init__(self, http: aiohttp.ClientSession, port: int) -> None:
        self.http = http
        self.base = f"http://127.0.0.1:{port}"

    async def get(self, path: str) -> tuple[int, Any]:
        async with self.http.get(self.base + path) as response:
            return response.status, await response.json()


async def test_readyz_follows_the_connection_and_healthz_answers_throughout(
    server: RunningServer, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    token = await server.add_cluster("prod-eu")
    settings = agent_settings(server, "prod-eu", token, tmp_path / "creds")
    async with running_agent(settings) as running:
        runner, port = await start_health_server(running.agent, "127.0.0.1", 0)
        try:
            assert port != 0
            probes = Probes(http, port)
            await running.wait_connected()
            assert await probes.get("/healthz") == (200, {"status": "ok"})
            assert await probes.get("/readyz") == (
                200,
                {"status": "connected", "cluster": "prod-eu"},
            )
            await server.stop()
            await until(lambda: running.agent.last_error is not None, max_turns=10**6)
            status, body = await probes.get("/readyz")
            assert status == 503
            assert body["status"] == "disconnected"
            reason = body["reason"]
            assert "connection ended" in reason or "cannot reach" in reason
            # Not ready is not dead: liveness still answers.
            assert await probes.get("/healthz") == (200, {"status": "ok"})
        finally:
            await runner.cleanup()


async def test_readyz_says_why_before_the_agent_has_connected(
    server: RunningServer, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    settings = agent_settings(server, "prod-eu", None, tmp_path / "creds")
    agent = Agent(settings, DirectoryCredentialStore(tmp_path / "creds"))  # not started yet
    runner, port = await start_health_server(agent, "127.0.0.1", 0)
    try:
        probes = Probes(http, port)
        assert await probes.get("/healthz") == (200, {"status": "ok"})
        assert await probes.get("/readyz") == (
            503,
            {"status": "disconnected", "reason": "connecting"},
        )
    finally:
        await runner.cleanup()
