"""A real server on loopback (real TLS, real sockets) and real agents, in-process."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from protocol import Keepalive
from tunnel_agent.backoff import Backoff
from tunnel_agent.config import AgentSettings, ConnectSettings
from tunnel_agent.connector import Agent, StreamHandler
from tunnel_agent.credentials import DirectoryCredentialStore
from tunnel_pki.tls import client_context
from tunnel_server.app import start_server, stop_server
from tunnel_server.config import (
    IdentitySettings,
    ListenSettings,
    ServerSettings,
    TunnelSettings,
)
from tunnel_server.context import CONTEXT, ServerContext

FAST_KEEPALIVE = Keepalive(interval=5.0, timeout=5.0)


def server_settings(state_dir: Path, port: int = 0, **overrides: Any) -> ServerSettings:
    """Settings for a test server on 127.0.0.1 (port 0: any free port)."""
    settings = ServerSettings(
        state_dir=state_dir,
        listen=ListenSettings(host="127.0.0.1", port=port, public_url="https://127.0.0.1:1"),
        identity=IdentitySettings(),
        tunnel=TunnelSettings(keepalive=FAST_KEEPALIVE, shutdown_grace=1.0, replace_grace=1.0),
    )
    return dataclasses.replace(settings, **overrides)


@dataclass
class RunningServer:
    """A started server, its URL, CA and admin token, and an API client."""

    settings: ServerSettings
    runner: web.AppRunner
    port: int
    url: str = ""
    ca_pem: bytes = b""
    admin_token: str = ""
    _http: aiohttp.ClientSession | None = field(default=None, repr=False)
    _stopped: bool = False

    @property
    def context(self) -> ServerContext:
        return self.runner.app[CONTEXT]

    async def api(
        self, method: str, path: str, body: Any = None, *, token: str | None = None
    ) -> tuple[int, Any]:
        """Call the REST API as the admin (or with ``token``); return status and JSON."""
        assert self._http is not None
        headers = {"Authorization": f"Bearer {token or self.admin_token}"}
        async with self._http.request(
            method,
            self.url + path,
            json=body,
            headers=headers,
            ssl=client_context(self.ca_pem),
        ) as response:
            text = await response.text()
            return response.status, json.loads(text) if text else None

    async def add_cluster(self, name: str) -> str:
        """Register a cluster; return its bootstrap token."""
        status, answer = await self.api("POST", "/api/v1/clusters", {"name": name})
        assert status == 201, answer
        token: str = answer["bootstrap_token"]
        return token

    async def cluster(self, name: str) -> dict[str, Any]:
        status, answer = await self.api("GET", f"/api/v1/clusters/{name}")
        assert status == 200, answer
        result: dict[str, Any] = answer
        return result

    async def stop(self) -> None:
        """Shut down as on SIGTERM (idempotent)."""
        if not self._stopped:
            self._stopped = True
            await stop_server(self.runner)


@contextlib.asynccontextmanager
async def running_server(settings: ServerSettings) -> AsyncIterator[RunningServer]:
    """Start a server; stop it (and close the API client) on exit."""
    runner, port = await start_server(settings)
    server = RunningServer(settings, runner, port)
    server.url = f"https://127.0.0.1:{port}"
    server.ca_pem = (settings.state_dir / "ca.crt").read_bytes()
    server.admin_token = (settings.state_dir / "admin-token").read_text().strip()
    async with aiohttp.ClientSession() as http:
        server._http = http
        try:
            yield server
        finally:
            await server.stop()


def agent_settings(
    server: RunningServer, cluster: str, token: str | None, credentials_dir: Path, **connect: Any
) -> AgentSettings:
    options: dict[str, Any] = {
        "backoff_base": 0.05,
        "backoff_cap": 0.5,
        "keepalive": FAST_KEEPALIVE,
        "connect_timeout": 5.0,
    }
    options.update(connect)
    return AgentSettings(
        server_url=server.url,
        ca_pem=server.ca_pem,
        cluster=cluster,
        bootstrap_token=token,
        credentials_dir=credentials_dir,
        connect=ConnectSettings(**options),
    )


@dataclass
class RunningAgent:
    agent: Agent
    task: asyncio.Task[None]

    async def wait_connected(self) -> None:
        """Wait until connected, failing early if the agent stops."""
        connected = asyncio.create_task(self.agent.connected.wait())
        done, _ = await asyncio.wait({connected, self.task}, return_when=asyncio.FIRST_COMPLETED)
        if connected not in done:
            connected.cancel()
            self.task.result()  # raises why the agent stopped
            raise AssertionError("the agent stopped without connecting")

    async def stop(self) -> None:
        if self.task.done():
            return  # it stopped on its own; the test looked at why
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


@contextlib.asynccontextmanager
async def running_agent(
    settings: AgentSettings,
    *,
    on_stream: StreamHandler | None = None,
    backoff: Backoff | None = None,
    **hooks: Any,
) -> AsyncIterator[RunningAgent]:
    """Run an agent (``hooks``: on_message, on_connected, on_disconnected)."""
    assert settings.credentials_dir is not None
    agent = Agent(
        settings,
        DirectoryCredentialStore(settings.credentials_dir),
        on_stream=on_stream,
        backoff=backoff,
        **hooks,
    )
    running = RunningAgent(agent, asyncio.create_task(agent.run()))
    try:
        yield running
    finally:
        await running.stop()


def short_lived_certificates(lifetime: timedelta) -> IdentitySettings:
    return IdentitySettings(client_cert_lifetime=lifetime)
