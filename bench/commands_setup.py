"""Setting up the command benchmark: the tunnel server, its clusters, the agents, the baseline.

The tunnel server is the real ``tunnel-server serve`` in its own process; the
clusters are registered through its REST API as an admin would, and every
agent bootstraps with its cluster's one-time token like a fresh install.
Agents run in :mod:`bench.commands_agent` processes, several per process.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from tunnel_pki.tls import client_context

from .commands_load import AgentEvents
from .commands_procs import BenchError, Children, free_port, wait_port

__all__ = [
    "Server",
    "add_clusters",
    "server_argv",
    "start_agents",
    "start_baseline",
    "start_server",
]


@dataclass
class Server:
    """A running server (the tunnel's or the baseline), and how to call it."""

    process: asyncio.subprocess.Process
    port: int
    state: Path
    token: str

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_file(self) -> Path:
        return self.state / "ca.crt"

    def context(self) -> ssl.SSLContext:
        return client_context(self.ca_file.read_bytes())


def server_argv(state: Path, port: int, log_level: str) -> list[str]:
    """The exact ``tunnel-server serve`` command line."""
    serve = ["serve", "--state-dir", str(state), "--listen", f"127.0.0.1:{port}"]
    serve += ["--shutdown-grace", "1s", "--log-level", log_level]
    script = Path(sys.executable).parent / "tunnel-server"
    if script.exists():
        return [str(script), *serve]
    return [sys.executable, "-m", "tunnel_server.cli", *serve]


async def start_server(children: Children, state: Path, log_level: str) -> Server:
    """Start ``tunnel-server serve`` on a free loopback port; wait for its /healthz."""
    port = free_port()
    process = await children.start("tunnel-server", server_argv(state, port, log_level))
    await wait_port(port, process, "the tunnel server")
    deadline = time.monotonic() + 30.0
    async with aiohttp.ClientSession() as http:
        while True:
            try:
                context = client_context((state / "ca.crt").read_bytes())
                async with http.get(f"https://127.0.0.1:{port}/healthz", ssl=context) as answer:
                    if answer.status == 200:
                        break
            except (OSError, aiohttp.ClientError):
                pass
            if time.monotonic() > deadline:
                raise BenchError("the tunnel server did not answer /healthz within 30 s")
            await asyncio.sleep(0.1)
    token = (state / "admin-token").read_text().strip()
    return Server(process, port, state, token)


async def add_clusters(server: Server, names: list[str]) -> dict[str, str]:
    """Register each cluster as an admin; return each one's bootstrap token."""
    headers = {"Authorization": f"Bearer {server.token}"}
    context = server.context()
    tokens: dict[str, str] = {}
    connector = aiohttp.TCPConnector(limit=8, ssl=context)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def add(name: str) -> None:
            url = f"{server.url}/api/v1/clusters"
            async with http.post(url, json={"name": name}, headers=headers) as answer:
                body: Any = await answer.json()
                if answer.status != 201:
                    raise BenchError(f"adding cluster {name} answered HTTP {answer.status}: {body}")
            tokens[name] = str(body["bootstrap_token"])

        await asyncio.gather(*(add(name) for name in names))
    return tokens


async def start_agents(
    children: Children,
    server: Server,
    run_dir: Path,
    tokens: dict[str, str],
    *,
    processes: int,
    concurrency: int,
    events: AgentEvents,
    label: str,
    log_level: str,
) -> list[asyncio.subprocess.Process]:
    """Start the agents of ``tokens`` in ``processes`` processes; wait until all are connected."""
    names = sorted(tokens)
    started: list[asyncio.subprocess.Process] = []
    (run_dir / "work").mkdir(exist_ok=True)
    for number in range(processes):
        mine = names[number::processes]
        if not mine:
            continue
        entries = [
            {
                "cluster": name,
                "credentials_dir": str(run_dir / "agents" / name),
                "bootstrap_token": tokens[name],
            }
            for name in mine
        ]
        config = run_dir / f"{label}-{number}.json"
        config.write_text(json.dumps(entries))
        argv = [sys.executable, "-m", "bench.commands_agent", "--server", server.url]
        argv += ["--ca", str(server.ca_file), "--agents", str(config)]
        argv += ["--concurrency", str(concurrency), "--workroot", str(run_dir / "work")]
        argv += ["--log-level", log_level]
        process = await children.start(f"{label}-{number}", argv, stdout=True)
        events.watch(process)
        started.append(process)
    await events.until(
        lambda: set(names) <= events.connected or any(p.returncode is not None for p in started),
        within=60.0 + len(names) * 0.5,
        what=f"{len(names)} agents to connect",
    )
    for process in started:
        if process.returncode is not None:
            raise BenchError(f"an agent process exited with status {process.returncode}")
    return started


async def start_baseline(children: Children, state: Path, run_dir: Path) -> Server:
    """Start the baseline server (:mod:`bench.commands_baseline`) with the tunnel's TLS files."""
    port = free_port()
    argv = [sys.executable, "-m", "bench.commands_baseline", "--port", str(port)]
    argv += ["--state-dir", str(state), "--db", str(run_dir / "baseline.db")]
    process = await children.start("baseline", argv)
    await wait_port(port, process, "the baseline server")
    return Server(process, port, state, "unused")
