"""Before anything is measured: a server that answers, and agents with credentials.

Agents are bootstrapped once, as they would be (keygen, CSR, bootstrap token
from the REST API), and their credentials cached with the server's state
directory; later runs reuse them while the CA is the same and the certificates
have two days left. :class:`HealthProbe` asks ``/healthz`` over fresh TLS
connections, to know when a server is up and how slow it answers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import ssl
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp

from tunnel_agent.config import AgentSettings, ConnectSettings
from tunnel_agent.connector import Agent
from tunnel_agent.credentials import Credentials, DirectoryCredentialStore
from tunnel_pki.certs import load_certificate
from tunnel_pki.errors import PkiError
from tunnel_pki.tls import client_context

from .idle_procs import BenchError, Children, cpu_seconds
from .idle_server import tunnel_server_argv

__all__ = ["Api", "HealthProbe", "prepare", "wait_healthy"]


class Api:
    """The tunnel server's REST API, as its admin."""

    def __init__(self, http: aiohttp.ClientSession, url: str, state: Path) -> None:
        self.http = http
        self.url = url
        self.ssl = client_context((state / "ca.crt").read_bytes())
        self.token = (state / "admin-token").read_text().strip()

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {self.token}"}
        async with self.http.request(
            method, self.url + path, json=body, headers=headers, ssl=self.ssl
        ) as response:
            text = await response.text()
            return response.status, json.loads(text) if text else None

    async def connected(self) -> int:
        """How many clusters the server says are connected now."""
        status, clusters = await self.call("GET", "/api/v1/clusters")
        if status != 200 or not isinstance(clusters, list):
            raise BenchError(f"GET /api/v1/clusters answered HTTP {status}")
        return sum(1 for cluster in clusters if cluster.get("connected"))


class HealthProbe:
    """Asks /healthz over fresh TLS connections: when the server is up, and how slow it is."""

    def __init__(self, http: aiohttp.ClientSession, url: str, ca_file: Path, pid: int) -> None:
        self.http = http
        self.url = url + "/healthz"
        self.ca_file = ca_file
        self.ssl: ssl.SSLContext | None = None
        self.pid = pid
        self.ready_at: float | None = None
        self.cpu_at_ready = 0.0
        self.latencies: list[float] = []

    def _context(self) -> ssl.SSLContext | None:
        # A new server writes its CA before it listens.
        if self.ssl is None and self.ca_file.exists():
            self.ssl = client_context(self.ca_file.read_bytes())
        return self.ssl

    async def run(self) -> None:
        while True:
            started = time.monotonic()
            context = self._context()
            try:
                if context is None:
                    raise ConnectionRefusedError
                async with self.http.get(
                    self.url, ssl=context, timeout=aiohttp.ClientTimeout(total=10.0)
                ) as response:
                    await response.read()
                    ok = response.status == 200
            except (aiohttp.ClientError, OSError, TimeoutError):
                ok = False
            now = time.monotonic()
            if ok and self.ready_at is None:
                self.ready_at = now
                self.cpu_at_ready = cpu_seconds(self.pid)
            elif ok:
                self.latencies.append(now - started)
            await asyncio.sleep(0.02 if self.ready_at is None else 0.25)


async def wait_healthy(probe: HealthProbe, process: asyncio.subprocess.Process) -> float:
    """Wait until the server answers /healthz; return when it first did."""
    task = asyncio.create_task(probe.run())
    try:
        deadline = time.monotonic() + 60.0
        while probe.ready_at is None:
            if process.returncode is not None:
                raise BenchError(f"the server exited with status {process.returncode}; see its log")
            if time.monotonic() > deadline:
                raise BenchError("the server did not answer /healthz within 60 s")
            await asyncio.sleep(0.02)
        return probe.ready_at
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _agent_name(index: int) -> str:
    return f"bench-{index:05d}"


def _usable(directory: Path, ca_pem: bytes | None) -> bool:
    """Credentials there, issued by this CA, valid for two more days."""
    try:
        if ca_pem is None or (directory / "ca.crt").read_bytes() != ca_pem:
            return False
        if not (directory / "tls.key").is_file() or not (directory / "cluster").is_file():
            return False
        certificate = load_certificate((directory / "tls.crt").read_bytes())
    except (OSError, PkiError):
        return False
    return certificate.not_valid_after_utc - datetime.now(UTC) > timedelta(days=2)


class _SavedSignal(DirectoryCredentialStore):
    """A DirectoryCredentialStore that says when the agent stored its credentials."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.saved = asyncio.Event()

    async def save(self, credentials: Credentials) -> None:
        await super().save(credentials)
        self.saved.set()


async def _bootstrap_one(settings: AgentSettings) -> None:
    """Bootstrap one agent as it would (keygen, CSR, token); stop it once it stored them."""
    assert settings.credentials_dir is not None
    store = _SavedSignal(settings.credentials_dir)
    agent = asyncio.create_task(Agent(settings, store).run())
    saved = asyncio.create_task(store.saved.wait())
    try:
        done, _ = await asyncio.wait(
            {agent, saved}, timeout=120.0, return_when=asyncio.FIRST_COMPLETED
        )
        if saved not in done:
            if agent.done():
                agent.result()  # raises why it stopped
            raise BenchError(f"bootstrap of {settings.cluster} did not finish within 120 s")
    finally:
        for task in (agent, saved):
            task.cancel()
        await asyncio.gather(agent, saved, return_exceptions=True)


async def prepare(
    args: argparse.Namespace,
    children: Children,
    http: aiohttp.ClientSession,
    port: int,
    run_dir: Path,
) -> list[Path]:
    """Credentials for every agent: the cached ones, and a bootstrap for the rest."""
    state = args.cache_dir / "state"
    dirs = [args.cache_dir / "agents" / _agent_name(i) for i in range(args.agents)]
    ca_file = state / "ca.crt"
    ca_pem = ca_file.read_bytes() if ca_file.exists() else None
    missing = [d for d in dirs if not _usable(d, ca_pem)]
    if not missing:
        print(f"credentials of {len(dirs)} agents cached in {args.cache_dir}")
        return dirs
    print(f"bootstrapping {len(missing)} agents, once (cached in {args.cache_dir}) ...")
    started = time.monotonic()
    url = f"https://127.0.0.1:{port}"
    argv = tunnel_server_argv(args, state, port, run_dir, experiment=False)
    server = await children.start("setup-server", argv)
    try:
        await wait_healthy(HealthProbe(http, url, ca_file, server.pid), server)
        server_ca = ca_file.read_bytes()
        api = Api(http, url, state)
        status, clusters = await api.call("GET", "/api/v1/clusters")
        if status != 200:
            raise BenchError(f"GET /api/v1/clusters answered HTTP {status}")
        known = {cluster["name"] for cluster in clusters}
        limit = asyncio.Semaphore(16)

        async def enrol(directory: Path) -> None:
            async with limit:
                name = directory.name
                if name in known:
                    status, answer = await api.call("POST", f"/api/v1/clusters/{name}/token")
                else:
                    status, answer = await api.call("POST", "/api/v1/clusters", {"name": name})
                if status != 201:
                    raise BenchError(f"cannot register {name}: HTTP {status} {answer}")
                shutil.rmtree(directory, ignore_errors=True)  # stale: another CA, or expired
                settings = AgentSettings(
                    server_url=url,
                    ca_pem=server_ca,
                    cluster=name,
                    bootstrap_token=answer["bootstrap_token"],
                    credentials_dir=directory,
                    connect=ConnectSettings(backoff_base=0.2, backoff_cap=5.0),
                )
                await _bootstrap_one(settings)

        await asyncio.gather(*(enrol(directory) for directory in missing))
    finally:
        await children.stop(server)
    print(f"  bootstrapped {len(missing)} agents in {time.monotonic() - started:.0f} s")
    return dirs
