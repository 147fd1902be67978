"""Setting up the proxy benchmark: tools, the upstream, the tunnel server and its agent.

The tunnel server is the real ``tunnel-server serve`` in its own process; the
cluster, a user and the user's grant are made through its REST API as an
admin would; the agent (:mod:`bench.proxy_agent`) bootstraps with the
cluster's token like a fresh install. The upstream listens on plain HTTP and,
with the tunnel server's own serving certificate and key, on TLS, so that
``direct-tls`` pays for the same handshake and cipher as the tunnel's first hop.
With ``--floor``, the two ends of :mod:`bench.relay_floor` (the cheapest Python
relay over the same hops) serve that same certificate too, and so do those of
:mod:`bench.mux_floor` (the same relay over the product's multiplexing layer).
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from tunnel_pki.tls import client_context

from .procs import REPO, BenchError, Children, free_port, wait_port
from .proxy_upstream import POD_PATH

__all__ = [
    "Experiment",
    "RelayFloor",
    "Tunnel",
    "Upstream",
    "ensure_tools",
    "environment",
    "start_agent",
    "start_relay_floor",
    "start_server",
    "start_upstream",
]

CLUSTER = "bench"
USER = "bench"
#: Debian packages that give the tools, by executable.
_PACKAGES = {
    "/usr/bin/wrk": "wrk",
    "/usr/bin/curl": "curl",
    "/usr/sbin/sshd": "openssh-server",
    "/usr/bin/ssh": "openssh-client",
    "/usr/bin/ssh-keygen": "openssh-client",
}


def ensure_tools(*, install: bool, ssh: bool) -> None:
    """Install wrk, curl and OpenSSH with apt-get if any is missing (as root), or explain."""
    needed = {path: package for path, package in _PACKAGES.items() if ssh or "ssh" not in path}
    missing = sorted({package for path, package in needed.items() if not Path(path).exists()})
    if not missing:
        return
    command = ["apt-get", "install", "-y", *missing]
    if not install or os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise BenchError(
            f"missing tools: {', '.join(missing)}; install them with "
            f"`apt-get update && {' '.join(command)}` (as root) and run again"
        )
    print(f"installing {', '.join(missing)} with apt-get ...", flush=True)
    environment = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (["apt-get", "update", "-qq"], [*command[:2], "-qq", *command[2:]]):
        done = subprocess.run(argv, env=environment, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise BenchError(f"`{' '.join(argv)}` failed: {done.stderr.strip()[-400:]}")


@dataclass
class Upstream:
    process: asyncio.subprocess.Process
    port: int
    tls_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def tls_url(self) -> str:
        return f"https://127.0.0.1:{self.tls_port}"


@dataclass
class Tunnel:
    """The running tunnel server and agent, and what a user needs to call through them."""

    server: asyncio.subprocess.Process
    agent: asyncio.subprocess.Process
    port: int
    state: Path
    user_token: str

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def base(self) -> str:
        return f"{self.url}/k8s/clusters/{CLUSTER}"

    @property
    def ca_file(self) -> Path:
        return self.state / "ca.crt"


async def start_upstream(children: Children, cert: Path, key: Path) -> Upstream:
    port, tls_port = free_port(), free_port()
    argv = [sys.executable, "-m", "bench.proxy_upstream", "--port", str(port)]
    argv += ["--tls-port", str(tls_port), "--cert", str(cert), "--key", str(key)]
    process = await children.start("upstream", argv)
    await wait_port(port, process, "the upstream")
    await wait_port(tls_port, process, "the upstream's TLS port")
    return Upstream(process, port, tls_port)


@dataclass
class RelayFloor:
    """The two ends of a relay floor (:mod:`bench.relay_floor` or :mod:`bench.mux_floor`),
    and where clients reach the near one."""

    near: asyncio.subprocess.Process
    far: asyncio.subprocess.Process
    port: int

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"


async def start_relay_floor(
    children: Children,
    state: Path,
    upstream_port: int,
    *,
    module: str = "bench.relay_floor",
    label: str = "relay",
) -> RelayFloor:
    """Start the near end (the tunnel server's certificate), then the far end dialling it.

    ``module`` is :mod:`bench.relay_floor` or :mod:`bench.mux_floor` (their command
    lines are the same); ``label`` names the logs (``LABEL-near.log``). Ready when the
    near end says the far end has connected.
    """
    what = f"the {module.rpartition('.')[2].replace('_', ' ')}"
    port, tunnel_port = free_port(), free_port()
    argv = [sys.executable, "-m", module, "near"]
    argv += ["--listen", f"127.0.0.1:{port}", "--tunnel-listen", f"127.0.0.1:{tunnel_port}"]
    argv += ["--cert", str(state / "server.crt"), "--key", str(state / "server.key")]
    near = await children.start(f"{label}-near", argv, stdout=True)
    await wait_port(port, near, f"{what}'s near end")
    await wait_port(tunnel_port, near, f"{what}'s tunnel port")
    argv = [sys.executable, "-m", module, "far"]
    argv += ["--tunnel", f"127.0.0.1:{tunnel_port}", "--ca", str(state / "ca.crt")]
    argv += ["--upstream", f"127.0.0.1:{upstream_port}"]
    far = await children.start(f"{label}-far", argv)
    assert near.stdout is not None
    deadline = time.monotonic() + 30.0
    while True:
        try:
            line = await asyncio.wait_for(near.stdout.readline(), deadline - time.monotonic())
        except TimeoutError as exc:
            raise BenchError(f"{what}'s far end did not connect within 30 s") from exc
        if not line:
            raise BenchError(f"{what}'s near end exited (status {near.returncode}); see its log")
        if json.loads(line).get("tunnel") == "connected":
            return RelayFloor(near, far, port)


@dataclass(frozen=True, slots=True)
class Experiment:
    """Other protocol limits (0: default), and the event loop of the server and the agent
    (``--event-loop``: auto takes uvloop)."""

    initial_window: int = 0
    max_frame_size: int = 0
    event_loop: str = "auto"
    shared_window: int = 0

    @property
    def active(self) -> bool:
        return bool(self.initial_window or self.max_frame_size or self.shared_window)

    def flags(self) -> list[str]:
        """The flags of bench.proxy_server or bench.proxy_agent."""
        return [
            "--initial-window",
            str(self.initial_window),
            "--max-frame-size",
            str(self.max_frame_size),
            "--shared-window",
            str(self.shared_window),
        ]


def _server_argv(state: Path, port: int, log_level: str, experiment: Experiment) -> list[str]:
    serve = ["serve", "--state-dir", str(state), "--listen", f"127.0.0.1:{port}"]
    serve += ["--shutdown-grace", "1s", "--log-level", log_level]
    serve += ["--event-loop", experiment.event_loop]
    if experiment.active:
        return [sys.executable, "-m", "bench.proxy_server", *experiment.flags(), "--", *serve]
    script = Path(sys.executable).parent / "tunnel-server"
    if script.exists():
        return [str(script), *serve]
    return [sys.executable, "-m", "tunnel_server.cli", *serve]


async def start_server(
    children: Children,
    state: Path,
    log_level: str,
    experiment: Experiment,
    wrap: Sequence[str] = (),
) -> tuple[asyncio.subprocess.Process, int]:
    """Start ``tunnel-server serve`` on a free loopback port; wait for its /healthz.

    ``wrap`` goes before its command line (e.g. :mod:`bench.profiled`'s).
    """
    port = free_port()
    argv = [*wrap, *_server_argv(state, port, log_level, experiment)]
    process = await children.start("tunnel-server", argv)
    await wait_port(port, process, "the tunnel server")
    deadline = time.monotonic() + 30.0
    async with aiohttp.ClientSession() as http:
        while True:
            try:
                context = client_context((state / "ca.crt").read_bytes())
                async with http.get(f"https://127.0.0.1:{port}/healthz", ssl=context) as answer:
                    if answer.status == 200:
                        return process, port
            except (OSError, aiohttp.ClientError):
                pass
            if time.monotonic() > deadline:
                raise BenchError("the tunnel server did not answer /healthz within 30 s")
            await asyncio.sleep(0.1)


async def _api(
    http: aiohttp.ClientSession,
    url: str,
    context: ssl.SSLContext,
    token: str,
    method: str,
    path: str,
    body: Any,
) -> Any:
    headers = {"Authorization": f"Bearer {token}"}
    async with http.request(method, url + path, json=body, headers=headers, ssl=context) as answer:
        if answer.status not in (200, 201):
            raise BenchError(
                f"{method} {path} answered HTTP {answer.status}: {await answer.text()}"
            )
        return await answer.json()


async def start_agent(
    children: Children,
    run_dir: Path,
    server: asyncio.subprocess.Process,
    port: int,
    upstream_url: str,
    experiment: Experiment,
    wrap: Sequence[str] = (),
) -> Tunnel:
    """Register the cluster, a user and its grant on the running server; start the agent.

    ``wrap`` goes before the agent's command line, as for :func:`start_server`.
    """
    state = run_dir / "state"
    url = f"https://127.0.0.1:{port}"
    context = client_context((state / "ca.crt").read_bytes())
    admin = (state / "admin-token").read_text().strip()
    async with aiohttp.ClientSession() as http:
        cluster = await _api(
            http, url, context, admin, "POST", "/api/v1/clusters", {"name": CLUSTER}
        )
        user = await _api(
            http, url, context, admin, "POST", "/api/v1/users", {"name": USER, "groups": ["bench"]}
        )
        await _api(
            http, url, context, admin, "PUT", f"/api/v1/grants/{USER}/{CLUSTER}", {"as_groups": []}
        )
        argv = [sys.executable, "-m", "bench.proxy_agent", "--server", url]
        argv += ["--ca", str(state / "ca.crt"), "--cluster", CLUSTER]
        argv += ["--credentials-dir", str(run_dir / "agent-credentials")]
        argv += ["--bootstrap-token", str(cluster["bootstrap_token"]), "--upstream", upstream_url]
        argv += experiment.flags()
        argv += ["--event-loop", experiment.event_loop]
        agent = await children.start("agent", [*wrap, *argv])
        tunnel = Tunnel(server, agent, port, state, str(user["token"]))
        await _wait_relaying(http, tunnel, context)
    return tunnel


async def _wait_relaying(
    http: aiohttp.ClientSession, tunnel: Tunnel, context: ssl.SSLContext
) -> None:
    """Wait until a request through the tunnel is answered by the upstream."""
    headers = {"Authorization": f"Bearer {tunnel.user_token}"}
    deadline = time.monotonic() + 60.0
    status = 0
    while time.monotonic() < deadline:
        if tunnel.agent.returncode is not None:
            raise BenchError(f"the agent exited with status {tunnel.agent.returncode}")
        async with http.get(tunnel.base + POD_PATH, headers=headers, ssl=context) as answer:
            status = answer.status
            if status == 200:
                return
        await asyncio.sleep(0.1)
    raise BenchError(f"the tunnel did not relay a request within 60 s (last answer HTTP {status})")


def _version(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    text = (done.stdout + done.stderr).strip().splitlines()
    return text[0].strip() if text else "unknown"


def environment() -> dict[str, Any]:
    """The machine and versions, for the report."""
    model = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    revision = _version(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    dirty = _version(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"])
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cores": os.cpu_count(),
        "cpu": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "aiohttp": aiohttp.__version__,
        "openssl": ssl.OPENSSL_VERSION,
        "openssh": _version(["/usr/bin/ssh", "-V"]),
        "wrk": _version(["/usr/bin/wrk", "-v"]).split(" [")[0],
        "curl": _version(["/usr/bin/curl", "--version"]).split(" (")[0],
        "revision": revision + (" (with uncommitted changes)" if dirty != "unknown" else ""),
    }
