"""Idle cost of connected agents: server memory and CPU per agent, and a restart storm.

N real agents (``tunnel_agent.connector.Agent``, each with its own mTLS
WebSocket and its own credentials directory) run in a few worker processes
against ONE ``tunnel-server serve`` process on 127.0.0.1. The benchmark
measures:

1. the server's RSS before the agents and with all N connected; the memory
   per connected agent is the difference divided by N;
2. the server's and the workers' CPU over an idle window, with the default
   keepalive (15 s), from ``/proc/PID/stat``;
3. a restart: the server is killed and started again on the same port and
   state directory, and every agent's reconnection time is recorded, with the
   503 + Retry-After answers the agents got (the agents count them in their
   back-off, so the figure is exactly the number of 503s the server answered).

The baseline is the same N idle TLS WebSockets to a trivial aiohttp server
with the same TLS settings and no protocol on top (it pings every 15 s, as our
keepalive does, so its CPU is the floor for the same traffic); our memory per
connection is reported as a ratio to it.

Experiments run the tunnel server through a wrapper with the same settings:
``--tracemalloc`` (growth of its Python allocations per agent), ``--profile``
(cProfile of the idle window or of the restart), ``--ssl-read-buffer`` (a
smaller asyncio SSL read buffer, in both servers) and ``--handshake-limit``
(at most K TLS handshakes in progress; the rest wait in the listen queue).

Agents are bootstrapped once and their credentials cached with the server's
state directory (``--cache-dir``), so later runs start at once. Everything
listens on 127.0.0.1. Every child process is started in its own session with
``PR_SET_PDEATHSIG`` (it dies with the benchmark) and is ended on exit, on
Ctrl-C, on failure and when the global ``--timeout`` expires.

    .venv/bin/python -m bench.bench_idle_agents                 # 200 agents, quick
    .venv/bin/python -m bench.bench_idle_agents --agents 2000 --processes 4
"""

from __future__ import annotations

import argparse
import asyncio
import asyncio.sslproto
import contextlib
import cProfile
import io
import json
import logging
import math
import os
import platform
import pstats
import random
import resource
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from protocol import Limits
from tunnel_agent.backoff import Backoff
from tunnel_agent.config import AgentSettings, ConnectSettings
from tunnel_agent.connector import Agent
from tunnel_agent.credentials import Credentials, DirectoryCredentialStore
from tunnel_agent.errors import AgentError, ConnectError
from tunnel_pki.certs import load_certificate
from tunnel_pki.errors import PkiError
from tunnel_pki.tls import client_context, server_context

__all__ = ["main"]

KIB = 1024
#: Targets from the issue (docs/benchmarks.md).
TARGET_KIB_PER_AGENT = 64.0
TARGET_RECONNECT_SECONDS = 30.0
#: The baseline server pings like our default keepalive does.
BASELINE_HEARTBEAT = 15.0

_REPO = Path(__file__).resolve().parents[1]
_MODULE = "bench.bench_idle_agents"
_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PIPE_LIMIT = 16 * 1024 * 1024
_STOP_GRACE = 10.0

# Run by every child before it becomes the real program: die with the benchmark
# (PR_SET_PDEATHSIG = 1 survives execve), or exit if it is already gone.
_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(70)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


class BenchError(Exception):
    """The benchmark could not measure what it set out to; the message says why."""


# --------------------------------------------------------------------------- /proc


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU time of ``pid`` so far."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()  # fields 3.. of proc(5)
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def _memory_kib(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM (peak RSS) and RssAnon of ``pid``, in KiB."""
    values: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon"):
            values[key] = int(rest.split()[0])
    return values


def _raise_nofile() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE as far as the hard limit allows; return both."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _set_ssl_read_buffer(size: int | None) -> None:
    # asyncio's SSLProtocol zero-fills a read buffer of this size per connection
    # (256 KiB in 3.11): the experiment --ssl-read-buffer measures a smaller one.
    if size:
        asyncio.sslproto.SSLProtocol.max_size = size


# --------------------------------------------------------------- worker process


class _Fleet:
    """What one worker's connections did, as their own events report it.

    Times are ``time.monotonic()``, which every process on the machine shares.
    An attempt starts when the back-off delay before it ends (or, the first
    time, when the agent starts), so attempt durations exclude the waiting.
    """

    def __init__(self, size: int, epoch: float) -> None:
        self.connected = 0
        self.sessions = 0
        self.attempt_started = [epoch] * size
        self.rss_before_kib = 0
        self.failures: list[str] = []
        self.mark()

    def mark(self) -> None:
        """From now on, count first connections, refusals and retries afresh."""
        self.connected_at: list[float | None] = [None] * len(self.attempt_started)
        self.refused = [0] * len(self.attempt_started)
        self.refused_at: list[float] = []
        self.refusal_seconds: list[float] = []
        self.attempt_seconds: list[float] = []
        self.retries = 0
        self.outcomes: Counter[str] = Counter()

    def on_connected(self, index: int) -> None:
        self.connected += 1
        self.sessions += 1
        if self.connected_at[index] is None:
            now = time.monotonic()
            self.connected_at[index] = now
            self.attempt_seconds.append(now - self.attempt_started[index])

    def on_disconnected(self) -> None:
        self.connected -= 1

    def on_retry(self, index: int, refused: bool, delay: float) -> None:
        now = time.monotonic()
        self.retries += 1
        if refused:
            self.refused[index] += 1
            self.refused_at.append(now)
            self.refusal_seconds.append(now - self.attempt_started[index])
        self.attempt_started[index] = now + delay

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        """Answer one command of the orchestrator."""
        command = request.get("cmd")
        if command == "status":
            return {
                "connected": self.connected,
                "done": sum(moment is not None for moment in self.connected_at),
                "sessions": self.sessions,
                "failures": self.failures[:3],
                "rss_before_kib": self.rss_before_kib,
            }
        if command == "mark":
            self.mark()
            return {"ok": True}
        if command == "times":
            return {
                "connected_at": self.connected_at,
                "refused": self.refused,
                "refused_at": self.refused_at,
                "refusal_seconds": self.refusal_seconds,
                "attempt_seconds": self.attempt_seconds,
                "retries": self.retries,
                "outcomes": dict(self.outcomes),
            }
        if command == "stop":
            return {"ok": True}
        return {"error": f"unknown command {command!r}"}


class _ConnectedFlag(asyncio.Event):
    """An agent's ``connected`` event that reports each change to the fleet."""

    def __init__(self, fleet: _Fleet, index: int) -> None:
        super().__init__()
        self._fleet = fleet
        self._index = index

    def set(self) -> None:
        if not self.is_set():
            self._fleet.on_connected(self._index)
        super().set()

    def clear(self) -> None:
        if self.is_set():
            self._fleet.on_disconnected()
        super().clear()


class _CountingBackoff(Backoff):
    """The agent's own back-off, counting its retries and the server's 503 answers."""

    __slots__ = ("_fleet", "_index")

    def __init__(
        self, fleet: _Fleet, index: int, *, base: float, cap: float, stable_after: float
    ) -> None:
        super().__init__(base=base, cap=cap, stable_after=stable_after)
        self._fleet = fleet
        self._index = index

    def next_delay(self, retry_after: float | None = None) -> float:
        delay = super().next_delay(retry_after)
        # Only a 503 + Retry-After carries a retry_after on the agent socket.
        self._fleet.on_retry(self._index, retry_after is not None, delay)
        return delay


class _Outcomes(logging.Handler):
    """Counts the agents' warnings by kind: why attempts failed, why sessions ended."""

    def __init__(self, fleet: _Fleet) -> None:
        super().__init__(logging.WARNING)
        self._fleet = fleet

    def emit(self, record: logging.LogRecord) -> None:
        self._fleet.outcomes[_outcome(record)] += 1


def _outcome(record: logging.LogRecord) -> str:
    args = record.args if isinstance(record.args, tuple) else ()
    error = args[0] if args else None
    if isinstance(error, ConnectError):
        if error.retry_after is not None:
            return "refused: 503 + Retry-After"
        what = str(error).split(": ")[0].split(" https://")[0]
        cause = error.__cause__
        return f"{what} ({type(cause).__name__})" if cause is not None else what
    return str(record.msg).split(":")[0][:60]


def _watch_agent_logs(fleet: _Fleet) -> None:
    errors = logging.StreamHandler(sys.stderr)
    errors.setLevel(logging.ERROR)
    errors.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(errors)
    logging.getLogger().setLevel(logging.ERROR)
    for name in ("tunnel_agent", "tunnel_mux"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.WARNING)
        logger.propagate = False
        logger.addHandler(_Outcomes(fleet))
        logger.addHandler(errors)


async def _run_agent(config: dict[str, Any], fleet: _Fleet, index: int, directory: Path) -> None:
    connect = ConnectSettings(
        backoff_base=float(config["backoff_base"]), backoff_cap=float(config["backoff_cap"])
    )
    settings = AgentSettings(
        server_url=str(config["url"]),
        ca_pem=(directory / "ca.crt").read_bytes(),
        cluster=directory.name,
        credentials_dir=directory,
        connect=connect,
    )
    backoff = _CountingBackoff(
        fleet,
        index,
        base=connect.backoff_base,
        cap=connect.backoff_cap,
        stable_after=connect.stable_after,
    )
    agent = Agent(settings, DirectoryCredentialStore(directory), backoff=backoff)
    agent.connected = _ConnectedFlag(fleet, index)
    fleet.attempt_started[index] = time.monotonic()
    try:
        await agent.run()
    except AgentError as exc:
        fleet.failures.append(f"{directory.name}: {exc}")


async def _run_plain(config: dict[str, Any], fleet: _Fleet, index: int, directory: Path) -> None:
    """The baseline client: one TLS WebSocket with the agent's certificate, nothing on top."""
    credentials = await DirectoryCredentialStore(directory).load()
    if credentials is None:
        fleet.failures.append(f"{directory.name}: no credentials")
        return
    context = client_context(
        credentials.ca_pem, cert_pem=credentials.cert_pem, key_pem=credentials.key_pem
    )
    flag = _ConnectedFlag(fleet, index)
    url = str(config["url"]) + "/ws"
    async with aiohttp.ClientSession() as http:
        while True:
            try:
                websocket = await http.ws_connect(
                    url,
                    ssl=context,
                    compress=0,
                    autoping=True,
                    heartbeat=None,
                    max_msg_size=Limits().message_limit,
                )
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                fleet.outcomes[f"plain: {type(exc).__name__}"] += 1
                await asyncio.sleep(random.uniform(0.0, 1.0))
                continue
            flag.set()
            try:
                async for _ in websocket:
                    pass
            finally:
                flag.clear()
                await websocket.close()


async def _serve_commands(fleet: _Fleet, stop: asyncio.Event) -> None:
    """Answer the orchestrator's JSON lines on stdin until ``stop`` or end of input."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=_PIPE_LIMIT)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    try:
        while line := await reader.readline():
            request = json.loads(line)
            sys.stdout.write(json.dumps(fleet.answer(request)) + "\n")
            sys.stdout.flush()
            if request.get("cmd") == "stop":
                break
    finally:
        stop.set()  # the orchestrator asked, or is gone


async def _worker(config: dict[str, Any]) -> int:
    _raise_nofile()
    dirs = [Path(item) for item in config["dirs"]]
    fleet = _Fleet(len(dirs), float(config["epoch"]))
    _watch_agent_logs(fleet)
    fleet.rss_before_kib = _memory_kib(os.getpid())["VmRSS"]
    run = _run_agent if config["mode"] == "agents" else _run_plain
    tasks = [asyncio.create_task(run(config, fleet, i, d)) for i, d in enumerate(dirs)]
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    commands = asyncio.create_task(_serve_commands(fleet, stop))
    try:
        await stop.wait()
    finally:
        for task in [*tasks, commands]:
            task.cancel()
        await asyncio.gather(*tasks, commands, return_exceptions=True)
    return 0


# ------------------------------------------------------------- server processes


async def _until_terminated() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()


async def _plain_healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _plain_websocket(request: web.Request) -> web.StreamResponse:
    # The agent socket's WebSocket settings (tunnel_server/agentsocket.py), no session on top.
    websocket = web.WebSocketResponse(
        timeout=2.0,
        max_msg_size=Limits().message_limit,
        compress=False,
        autoping=True,
        heartbeat=BASELINE_HEARTBEAT,
    )
    await websocket.prepare(request)
    async for _ in websocket:
        pass
    return websocket


async def _baseline_server(port: int, state_dir: Path) -> None:
    """A trivial aiohttp WebSocket server with the tunnel server's TLS settings and key."""
    context = server_context(
        (state_dir / "server.crt").read_bytes(),
        (state_dir / "server.key").read_bytes(),
        (state_dir / "ca.crt").read_bytes(),
    )
    app = web.Application()
    app.router.add_get("/healthz", _plain_healthz)
    app.router.add_get("/ws", _plain_websocket)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, ssl_context=context, backlog=1024)
    await site.start()
    try:
        await _until_terminated()
    finally:
        await runner.cleanup()


def _short_path(filename: str) -> str:
    for marker in ("site-packages/", "/lib/python3.", str(_REPO) + "/"):
        if marker in filename:
            tail = filename.split(marker, 1)[1]
            return tail.split("/", 1)[1] if marker == "/lib/python3." else tail
    return filename


class _AllocationDumps:
    """SIGUSR1 in the traced server: the first takes a snapshot, later ones write the growth."""

    def __init__(self, path: Path, frames: int) -> None:
        self.path = path
        self.frames = frames
        self.first: tracemalloc.Snapshot | None = None

    def __call__(self) -> None:
        ignore = [tracemalloc.Filter(False, tracemalloc.__file__)]
        snapshot = tracemalloc.take_snapshot().filter_traces(ignore)
        if self.first is None:
            self.first = snapshot
            lines = ["baseline"]
        else:
            lines = self._growth(snapshot)
        partial = self.path.with_suffix(".partial")
        partial.write_text("\n".join(lines) + "\n")
        partial.replace(self.path)

    def _growth(self, snapshot: tracemalloc.Snapshot) -> list[str]:
        assert self.first is not None
        diffs = snapshot.compare_to(self.first, "lineno")
        files: Counter[str] = Counter()
        for diff in diffs:
            files[_short_path(diff.traceback[0].filename)] += diff.size_diff
        lines = [f"total\t{sum(diff.size_diff for diff in diffs)}\t-"]
        lines += [f"file\t{size}\t{name}" for name, size in files.most_common(12)]
        for diff in diffs[:25]:
            frame = diff.traceback[0]
            where = f"{_short_path(frame.filename)}:{frame.lineno}"
            lines.append(f"line\t{diff.size_diff}\t{where} ({diff.count_diff:+d} blocks)")
        if self.frames > 1:
            for diff in snapshot.compare_to(self.first, "traceback")[:6]:
                where = " -> ".join(f"{_short_path(f.filename)}:{f.lineno}" for f in diff.traceback)
                lines.append(f"traceback\t{diff.size_diff}\t{where}")
        return lines


class _Profile:
    """SIGUSR2 in the profiled server: start profiling (unless started), then write the top."""

    def __init__(self, path: Path, *, started: bool) -> None:
        self.path = path
        self.profiler = cProfile.Profile()
        self.running = started
        if started:
            self.profiler.enable()

    def __call__(self) -> None:
        if not self.running:
            self.running = True
            self.profiler.enable()
            return
        self.profiler.disable()
        text = io.StringIO()
        pstats.Stats(self.profiler, stream=text).sort_stats("tottime").print_stats(30)
        partial = self.path.with_suffix(".partial")
        partial.write_text(text.getvalue())
        partial.replace(self.path)


async def _serve_limited(settings: Any, limit: int) -> None:
    """``start_server`` with one change: at most ``limit`` TLS handshakes in progress.

    The kernel's listen queue holds the rest, first come first served, instead
    of every handshake advancing in lockstep (the proposed fix, measured).
    """
    from tunnel_server.app import create_app
    from tunnel_server.context import utcnow
    from tunnel_server.statedir import prepare_state_dir

    identity = prepare_state_dir(settings, utcnow())
    context = server_context(identity.tls_cert_pem, identity.tls_key_pem, identity.ca.cert_pem)
    app = create_app(settings, identity)
    runner = web.AppRunner(
        app, handle_signals=False, access_log=None, shutdown_timeout=settings.tunnel.shutdown_grace
    )
    await runner.setup()
    factory = runner.server
    assert factory is not None
    listener = socket.create_server((settings.listen.host, settings.listen.port), backlog=1024)
    listener.setblocking(False)
    loop = asyncio.get_running_loop()
    slots = asyncio.Semaphore(limit)
    handshakes: set[asyncio.Task[Any]] = set()

    def finished(task: asyncio.Task[Any]) -> None:
        handshakes.discard(task)
        slots.release()
        if not task.cancelled():
            task.exception()  # a failed handshake closed its socket; nothing else to do

    async def accept() -> None:
        while True:
            await slots.acquire()
            connection, _ = await loop.sock_accept(listener)
            task = asyncio.create_task(
                loop.connect_accepted_socket(factory, connection, ssl=context)
            )
            handshakes.add(task)
            task.add_done_callback(finished)

    accepting = asyncio.create_task(accept())
    try:
        await _until_terminated()
    finally:
        accepting.cancel()
        for task in list(handshakes):
            task.cancel()
        await asyncio.gather(accepting, *handshakes, return_exceptions=True)
        listener.close()
        await runner.cleanup()


async def _serve_experiment(args: argparse.Namespace) -> None:
    """``tunnel-server serve`` with the same settings, traced, profiled or changed as asked."""
    from tunnel_cli import configure_logging
    from tunnel_server.app import run_server
    from tunnel_server.cli import build_parser, settings_from_args

    serve = build_parser().parse_args(json.loads(args.serve_args))
    configure_logging(serve.log_format, serve.log_level)
    settings = settings_from_args(serve)
    loop = asyncio.get_running_loop()
    if args.tracemalloc:
        dumps = _AllocationDumps(args.dump / "tracemalloc.txt", args.tracemalloc)
        loop.add_signal_handler(signal.SIGUSR1, dumps)
    if args.profile:
        profile = _Profile(args.dump / "profile.txt", started=args.profile == "restart")
        loop.add_signal_handler(signal.SIGUSR2, profile)
    if args.handshake_limit:
        await _serve_limited(settings, args.handshake_limit)
    else:
        await run_server(settings)


# ----------------------------------------------------------------- orchestrator


def _child_environment() -> dict[str, str]:
    # The tree this benchmark is in, also for console scripts (their sys.path lacks the cwd).
    environment = dict(os.environ)
    paths = [str(_REPO), *filter(None, environment.get("PYTHONPATH", "").split(os.pathsep))]
    environment["PYTHONPATH"] = os.pathsep.join(paths)
    return environment


class _Children:
    """Every process the benchmark started; each ends when the benchmark does."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self._processes: list[asyncio.subprocess.Process] = []

    async def start(
        self, name: str, argv: list[str], *, pipes: bool = False
    ) -> asyncio.subprocess.Process:
        with (self.logs / f"{name}.log").open("ab") as log:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-S",
                "-c",
                _WITH_PARENT,
                str(os.getpid()),
                *argv,
                stdin=asyncio.subprocess.PIPE if pipes else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE if pipes else log,
                stderr=log,
                cwd=_REPO,
                env=_child_environment(),
                start_new_session=True,  # a Ctrl-C reaches the benchmark alone; it ends them
                limit=_PIPE_LIMIT,
            )
        self._processes.append(process)
        return process

    async def stop(self, process: asyncio.subprocess.Process) -> None:
        """SIGTERM, then SIGKILL after a grace period."""
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
            try:
                await asyncio.wait_for(process.wait(), _STOP_GRACE)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        if process in self._processes:
            self._processes.remove(process)

    async def stop_all(self) -> None:
        await asyncio.gather(*(self.stop(process) for process in list(self._processes)))


class _Worker:
    """One worker process, driven by JSON lines over its stdin and stdout."""

    def __init__(self, process: asyncio.subprocess.Process, size: int) -> None:
        self.process = process
        self.size = size
        self._lock = asyncio.Lock()

    async def ask(self, command: str, **fields: Any) -> dict[str, Any]:
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None
        assert stdout is not None
        async with self._lock:
            try:
                stdin.write(json.dumps({"cmd": command, **fields}).encode() + b"\n")
                await stdin.drain()
                line = await asyncio.wait_for(stdout.readline(), 60.0)
            except (ConnectionError, TimeoutError) as exc:
                raise BenchError(f"worker {self.process.pid} does not answer: {exc!r}") from exc
        if not line:
            raise BenchError(f"worker {self.process.pid} exited; see its log")
        answer: dict[str, Any] = json.loads(line)
        return answer


class _Api:
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


class _HealthProbe:
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
                self.cpu_at_ready = _cpu_seconds(self.pid)
            elif ok:
                self.latencies.append(now - started)
            await asyncio.sleep(0.02 if self.ready_at is None else 0.25)


async def _wait_healthy(probe: _HealthProbe, process: asyncio.subprocess.Process) -> float:
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


def _tunnel_server_argv(
    args: argparse.Namespace,
    state: Path,
    port: int,
    run_dir: Path,
    *,
    experiment: bool,
    profile: str | None = None,
) -> list[str]:
    serve = ["serve", "--state-dir", str(state), "--listen", f"127.0.0.1:{port}"]
    serve += ["--shutdown-grace", "1s", "--log-level", args.server_log_level]
    changed = args.tracemalloc or args.ssl_read_buffer or args.handshake_limit or profile
    if experiment and changed:
        # The same settings through the same code, in a wrapper that can trace or change it.
        wrapper = [sys.executable, "-m", _MODULE, "--role", "tunnel-server", "--dump", str(run_dir)]
        wrapper += ["--serve-args", json.dumps(serve), "--tracemalloc", str(args.tracemalloc)]
        wrapper += ["--ssl-read-buffer", str(args.ssl_read_buffer)]
        wrapper += ["--handshake-limit", str(args.handshake_limit)]
        return wrapper + (["--profile", profile] if profile else [])
    script = Path(sys.executable).parent / "tunnel-server"
    if script.exists():
        return [str(script), *serve]
    return [sys.executable, "-m", "tunnel_server.cli", *serve]


async def _prepare(
    args: argparse.Namespace,
    children: _Children,
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
    argv = _tunnel_server_argv(args, state, port, run_dir, experiment=False)
    server = await children.start("setup-server", argv)
    try:
        await _wait_healthy(_HealthProbe(http, url, ca_file, server.pid), server)
        server_ca = ca_file.read_bytes()
        api = _Api(http, url, state)
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


async def _start_workers(
    args: argparse.Namespace,
    children: _Children,
    dirs: list[Path],
    mode: str,
    url: str,
    run_dir: Path,
) -> list[_Worker]:
    epoch = time.monotonic()
    per_worker = math.ceil(len(dirs) / args.processes)
    workers = []
    for number in range(args.processes):
        part = dirs[number * per_worker : (number + 1) * per_worker]
        if not part:
            break
        config = {
            "mode": mode,
            "url": url,
            "dirs": [str(d) for d in part],
            "epoch": epoch,
            "backoff_base": args.backoff_base,
            "backoff_cap": args.backoff_cap,
        }
        config_path = run_dir / f"{mode}-worker-{number}.json"
        config_path.write_text(json.dumps(config))
        argv = [sys.executable, "-m", _MODULE, "--role", "worker", "--config", str(config_path)]
        process = await children.start(f"{mode}-worker-{number}", argv, pipes=True)
        workers.append(_Worker(process, len(part)))
    return workers


async def _wait_all_connected(workers: list[_Worker], limit: float, label: str) -> float:
    """Wait until every connection of every worker is up (and new since the last mark)."""
    total = sum(worker.size for worker in workers)
    deadline = time.monotonic() + limit
    shown = time.monotonic()
    while True:
        statuses = await asyncio.gather(*(worker.ask("status") for worker in workers))
        failures = [failure for status in statuses for failure in status["failures"]]
        if failures:
            raise BenchError(f"{label}: agents stopped: {'; '.join(failures)}")
        done = sum(int(status["done"]) for status in statuses)
        connected = sum(int(status["connected"]) for status in statuses)
        now = time.monotonic()
        if done >= total and connected >= total:
            return now
        if now > deadline:
            raise BenchError(f"{label}: {connected} of {total} connected after {limit:.0f} s")
        if now - shown >= 5.0:
            print(f"  {label}: {connected} of {total} connected")
            shown = now
        await asyncio.sleep(0.2)


def _percentiles(values: list[float]) -> dict[str, float]:
    """Nearest-rank p50, p90, p99 and the maximum."""
    ordered = sorted(values)
    if not ordered:
        return {}

    def rank(q: float) -> float:
        return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]

    return {"p50": rank(50), "p90": rank(90), "p99": rank(99), "max": ordered[-1]}


def _timeline(moments: list[float], refusals: list[float]) -> list[tuple[float, int, int]]:
    """(bucket start, connections, 503 answers) in at most 16 equal buckets."""
    end = max([*moments, *refusals, 1.0])
    width = max(1.0, math.ceil(end / 16))
    buckets = [(i * width, 0, 0) for i in range(int(end // width) + 1)]
    counts = [[0, 0] for _ in buckets]
    for column, values in enumerate((moments, refusals)):
        for value in values:
            counts[min(int(max(value, 0.0) // width), len(counts) - 1)][column] += 1
    return [(start, c[0], c[1]) for (start, _, _), c in zip(buckets, counts, strict=True)]


async def _connection_times(
    workers: list[_Worker], since: float, first_attempts: int = 0
) -> dict[str, Any]:
    """Each connection's first connect after the last mark (seconds after ``since``).

    Attempts are counted by the back-off, which runs before every attempt but
    the agent's very first: ``first_attempts`` adds those.
    """
    answers = await asyncio.gather(*(worker.ask("times") for worker in workers))
    moments = [m - since for answer in answers for m in answer["connected_at"] if m is not None]
    refused = [int(n) for answer in answers for n in answer["refused"]]
    refused_at = [t - since for answer in answers for t in answer["refused_at"]]
    outcomes: Counter[str] = Counter()
    for answer in answers:
        outcomes.update(answer["outcomes"])
    return {
        "seconds": _percentiles(moments),
        "refusals_503": sum(refused),
        "agents_refused": sum(1 for n in refused if n),
        "attempts": first_attempts + sum(int(answer["retries"]) for answer in answers),
        "attempt_seconds": _percentiles([t for a in answers for t in a["attempt_seconds"]]),
        "refusal_seconds": _percentiles([t for a in answers for t in a["refusal_seconds"]]),
        "timeline": _timeline(moments, refused_at),
        "outcomes": dict(outcomes.most_common()),
    }


async def _measure_idle(
    args: argparse.Namespace, server_pid: int, workers: list[_Worker], profile: Path | None = None
) -> dict[str, Any]:
    """Settle, then CPU over the idle window and RSS at both ends of it."""
    await asyncio.sleep(args.settle)
    pids = [worker.process.pid for worker in workers]
    rss_start = _memory_kib(server_pid)
    if profile is not None:
        os.kill(server_pid, signal.SIGUSR2)  # start profiling
    server_cpu, workers_cpu = _cpu_seconds(server_pid), sum(map(_cpu_seconds, pids))
    started = time.monotonic()
    await asyncio.sleep(args.idle)
    elapsed = time.monotonic() - started
    server_cpu = _cpu_seconds(server_pid) - server_cpu
    workers_cpu = sum(map(_cpu_seconds, pids)) - workers_cpu
    statuses = await asyncio.gather(*(worker.ask("status") for worker in workers))
    profiled = {}
    if profile is not None:
        profiled["profile"] = await _ask_file(profile, server_pid, signal.SIGUSR2)
    return {
        **profiled,
        "idle_seconds": elapsed,
        "server_rss_settled_kib": rss_start,
        "server_rss_connected_kib": _memory_kib(server_pid),
        "server_cpu_percent": 100 * server_cpu / elapsed,
        "workers_cpu_percent": 100 * workers_cpu / elapsed,
        "workers_rss_kib": sum(_memory_kib(pid)["VmRSS"] for pid in pids),
        "workers_rss_before_kib": sum(int(status["rss_before_kib"]) for status in statuses),
        "connected_at_end": sum(int(status["connected"]) for status in statuses),
        "sessions": sum(int(status["sessions"]) for status in statuses),
    }


async def _stop_workers(children: _Children, workers: list[_Worker]) -> None:
    for worker in workers:
        with contextlib.suppress(BenchError):
            await asyncio.wait_for(worker.ask("stop"), 5.0)
    await asyncio.gather(*(children.stop(worker.process) for worker in workers))


def _forget(path: Path) -> None:
    path.unlink(missing_ok=True)


def _lines_if_written(path: Path) -> list[str] | None:
    return path.read_text().splitlines() if path.exists() else None


async def _ask_file(path: Path, pid: int, signum: signal.Signals) -> list[str]:
    """Signal the wrapped server and read the file it writes in answer."""
    _forget(path)
    os.kill(pid, signum)
    deadline = time.monotonic() + 120.0
    while (lines := _lines_if_written(path)) is None:
        if time.monotonic() > deadline:
            raise BenchError(f"the wrapped server did not write {path.name} within 120 s")
        await asyncio.sleep(0.2)
    return lines


async def _tunnel_phase(
    args: argparse.Namespace,
    children: _Children,
    http: aiohttp.ClientSession,
    dirs: list[Path],
    port: int,
    run_dir: Path,
) -> dict[str, Any]:
    state = args.cache_dir / "state"
    url = f"https://127.0.0.1:{port}"
    idle = "idle" if args.profile == "idle" else None
    argv = _tunnel_server_argv(args, state, port, run_dir, experiment=True, profile=idle)
    result: dict[str, Any] = {"server_argv": [*argv[:2], "serve", "..."]}
    print("tunnel server: starting it, then the agents ...")
    server = await children.start("tunnel-server-1", argv)
    await _wait_healthy(_HealthProbe(http, url, state / "ca.crt", server.pid), server)
    await asyncio.sleep(args.settle)
    result["server_rss_before_kib"] = _memory_kib(server.pid)
    dump = run_dir / "tracemalloc.txt"
    if args.tracemalloc:
        await _ask_file(dump, server.pid, signal.SIGUSR1)
    server_cpu = _cpu_seconds(server.pid)
    workers = await _start_workers(args, children, dirs, "agents", url, run_dir)
    spawned = time.monotonic()
    done = await _wait_all_connected(workers, args.connect_timeout, "cold start")
    server_cpu = _cpu_seconds(server.pid) - server_cpu
    result["cold_start_all_connected_seconds"] = done - spawned
    cold = await _connection_times(workers, spawned, first_attempts=len(dirs))
    cold.update(
        {
            "all_connected_seconds": done - spawned,
            "server_cpu_seconds": server_cpu,
            "server_cpu_percent": 100 * server_cpu / (done - spawned),
            "workers_cpu_seconds": sum(_cpu_seconds(w.process.pid) for w in workers),
        }
    )
    result["cold_start"] = cold
    profile = (run_dir / "profile.txt") if idle else None
    result.update(await _measure_idle(args, server.pid, workers, profile))
    result["api_connected"] = await _Api(http, url, state).connected()
    if args.tracemalloc:
        result["tracemalloc"] = await _ask_file(dump, server.pid, signal.SIGUSR1)
    if args.skip_restart:
        return result

    how = signal.SIGKILL if args.restart_signal == "kill" else signal.SIGTERM
    print(f"tunnel server: restarting it ({how.name}) with {len(dirs)} agents connected ...")
    await asyncio.gather(*(worker.ask("mark") for worker in workers))
    killed = time.monotonic()
    workers_cpu = sum(_cpu_seconds(worker.process.pid) for worker in workers)
    server.send_signal(how)
    await server.wait()
    down = time.monotonic()
    restart = "restart" if args.profile == "restart" else None
    argv = _tunnel_server_argv(args, state, port, run_dir, experiment=True, profile=restart)
    server = await children.start("tunnel-server-2", argv)
    probe = _HealthProbe(http, url, state / "ca.crt", server.pid)
    probing = asyncio.create_task(probe.run())
    try:
        done = await _wait_all_connected(workers, args.connect_timeout, "restart")
    finally:
        probing.cancel()
        await asyncio.gather(probing, return_exceptions=True)
    server_cpu = _cpu_seconds(server.pid)
    storm = await _connection_times(workers, killed)
    if args.profile == "restart":
        result["profile"] = await _ask_file(run_dir / "profile.txt", server.pid, signal.SIGUSR2)
    ready = probe.ready_at if probe.ready_at is not None else done
    storm.update(
        {
            "signal": how.name,
            "old_server_gone_seconds": down - killed,
            "server_ready_seconds": ready - killed,
            "all_connected_seconds": done - killed,
            "server_cpu_percent": 100 * (server_cpu - probe.cpu_at_ready) / max(done - ready, 1e-3),
            "server_cpu_seconds": server_cpu - probe.cpu_at_ready,
            "workers_cpu_seconds": sum(_cpu_seconds(w.process.pid) for w in workers) - workers_cpu,
            "healthz_seconds": _percentiles(probe.latencies),
            "server_rss_after_kib": _memory_kib(server.pid),
            "api_connected": await _Api(http, url, state).connected(),
        }
    )
    result["restart"] = storm
    await _stop_workers(children, workers)
    return result


async def _baseline_phase(
    args: argparse.Namespace,
    children: _Children,
    http: aiohttp.ClientSession,
    dirs: list[Path],
    port: int,
    run_dir: Path,
) -> dict[str, Any]:
    state = args.cache_dir / "state"
    url = f"https://127.0.0.1:{port}"
    print("baseline: plain aiohttp WebSocket server, then the same number of connections ...")
    argv = [sys.executable, "-m", _MODULE, "--role", "baseline-server", "--port", str(port)]
    argv += ["--state-dir", str(state), "--ssl-read-buffer", str(args.ssl_read_buffer or 0)]
    server = await children.start("baseline-server", argv)
    await _wait_healthy(_HealthProbe(http, url, state / "ca.crt", server.pid), server)
    await asyncio.sleep(args.settle)
    result: dict[str, Any] = {"server_rss_before_kib": _memory_kib(server.pid)}
    workers = await _start_workers(args, children, dirs, "plain", url, run_dir)
    spawned = time.monotonic()
    done = await _wait_all_connected(workers, args.connect_timeout, "baseline")
    result["cold_start_all_connected_seconds"] = done - spawned
    result.update(await _measure_idle(args, server.pid, workers))
    await _stop_workers(children, workers)
    return result


def _environment() -> dict[str, Any]:
    revision = subprocess.run(
        ["git", "-C", str(_REPO), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "aiohttp": aiohttp.__version__,
        "openssl": ssl.OPENSSL_VERSION,
        "revision": revision or "unknown",
        "load_average_at_start": os.getloadavg(),
    }


async def _orchestrate(args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    children = _Children(run_dir)
    main_task = asyncio.current_task()
    assert main_task is not None
    # SIGTERM ends the run like Ctrl-C does: the children are stopped first.
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    try:
        async with asyncio.timeout(args.timeout):
            return await _run(args, children, run_dir)
    except TimeoutError as exc:
        raise BenchError(f"the benchmark did not finish within --timeout {args.timeout} s") from exc
    finally:
        await children.stop_all()


async def _run(args: argparse.Namespace, children: _Children, run_dir: Path) -> dict[str, Any]:
    soft, hard = _raise_nofile()
    needed = args.agents + 256  # the server holds one socket per agent, plus its own files
    results: dict[str, Any] = {
        "environment": _environment(),
        "agents": args.agents,
        "processes": args.processes,
        "nofile": {"soft": soft, "hard": hard, "needed_by_server": needed},
        "backoff": {"base": args.backoff_base, "cap": args.backoff_cap},
        "settle_seconds": args.settle,
        "profile": args.profile,
    }
    if soft < needed:
        raise BenchError(
            f"RLIMIT_NOFILE is {soft} (hard {hard}); {args.agents} agents need about "
            f"{needed} descriptors in the server: raise the hard limit or lower --agents"
        )
    port = args.port or _free_port()
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as http:
        dirs = await _prepare(args, children, http, port, run_dir)
        try:
            results["tunnel"] = await _tunnel_phase(args, children, http, dirs, port, run_dir)
        finally:
            await children.stop_all()
        if not args.skip_baseline:
            results["baseline"] = await _baseline_phase(args, children, http, dirs, port, run_dir)
    # Other work on the machine skews CPU and timing figures: say how busy it was.
    results["environment"]["load_average_at_end"] = os.getloadavg()
    return results


# ---------------------------------------------------------------------- report


def _per_agent_kib(phase: dict[str, Any], agents: int) -> float:
    before = phase["server_rss_before_kib"]["VmRSS"]
    return float(phase["server_rss_connected_kib"]["VmRSS"] - before) / agents


def _seconds(values: dict[str, float]) -> str:
    if not values:
        return "-"
    return " / ".join(f"{values[k]:.2f}" for k in ("p50", "p90", "p99", "max")) + " s"


def _storm_lines(storm: dict[str, Any], agents: int) -> list[str]:
    """How a fleet (re)connected: when, how often refused, what it cost."""
    timeline = ", ".join(f"{start:g}s:{up}/{busy}" for start, up, busy in storm["timeline"])
    return [
        f"  {f'all {agents} agents connected after':42}{storm['all_connected_seconds']:.2f} s"
        f"  (target <= {TARGET_RECONNECT_SECONDS:g} s after a restart)",
        f"  connected, p50 / p90 / p99 / max          {_seconds(storm['seconds'])}",
        f"  one successful attempt took (no waiting)  {_seconds(storm['attempt_seconds'])}",
        f"  one refused attempt took (no waiting)     {_seconds(storm['refusal_seconds'])}",
        f"  503 + Retry-After answers                 {storm['refusals_503']}"
        f" (to {storm['agents_refused']} agents)",
        f"  connection attempts                       {storm['attempts']}",
        f"  server CPU until all connected            {storm['server_cpu_percent']:.0f} % of one"
        f" core ({storm['server_cpu_seconds']:.1f} s)",
        f"  agent processes CPU until all connected   {storm['workers_cpu_seconds']:.1f} s",
        f"  timeline, bucket start: connected/503s    {timeline}",
        f"  what the agents saw                       {storm['outcomes']}",
    ]


def _report(results: dict[str, Any], command: str) -> str:
    agents = int(results["agents"])
    tunnel, baseline = results["tunnel"], results.get("baseline")
    mib = 1.0 / KIB
    lines = [
        f"Idle agents: {agents} agents in {results['processes']} processes, one tunnel server, "
        f"loopback, keepalive 15 s, back-off base {results['backoff']['base']:g} s "
        f"cap {results['backoff']['cap']:g} s",
        f"  {results['environment']}",
        f"  RLIMIT_NOFILE soft {results['nofile']['soft']} hard {results['nofile']['hard']} "
        f"(the server needs about {results['nofile']['needed_by_server']})",
        "",
        f"{'':46}{'tunnel':>14}{'baseline':>14}",
    ]

    def row(label: str, key: Any, fmt: str = "{:.1f}", note: str = "") -> None:
        values = [key(phase) if phase is not None else None for phase in (tunnel, baseline)]
        cells = [f"{fmt.format(v):>14}" if v is not None else f"{'-':>14}" for v in values]
        lines.append(f"{label:46}{''.join(cells)}  {note}".rstrip())

    row("server RSS before connections (MiB)", lambda p: p["server_rss_before_kib"]["VmRSS"] * mib)
    row(
        "server RSS, all connected, idle (MiB)",
        lambda p: p["server_rss_connected_kib"]["VmRSS"] * mib,
    )
    row(
        "server memory per connection (KiB)",
        lambda p: _per_agent_kib(p, agents),
        note=f"target <= {TARGET_KIB_PER_AGENT:g} KiB",
    )
    row(
        "  anonymous memory per connection (KiB)",
        lambda p: (
            (p["server_rss_connected_kib"]["RssAnon"] - p["server_rss_before_kib"]["RssAnon"])
            / agents
        ),
    )
    row("server CPU at idle (% of one core)", lambda p: p["server_cpu_percent"], "{:.2f}")
    row("agent processes CPU at idle (% of one core)", lambda p: p["workers_cpu_percent"], "{:.2f}")
    row(
        "agent processes memory per connection (KiB)",
        lambda p: (p["workers_rss_kib"] - p["workers_rss_before_kib"]) / agents,
    )
    row("cold start: all connected after (s)", lambda p: p["cold_start_all_connected_seconds"])
    row("connections up at end of idle window", lambda p: p["connected_at_end"], "{:d}")
    if baseline is not None:
        ratio = _per_agent_kib(tunnel, agents) / max(_per_agent_kib(baseline, agents), 1e-9)
        lines.append(f"{'memory per connection, tunnel / baseline':46}{ratio:>13.2f}x")
    lines.append(
        f"server API: {tunnel['api_connected']} connected; sessions established during the "
        f"idle phase: {tunnel['sessions']} (one each: no reconnects)"
    )
    lines += ["", "Cold start (every agent starts at once; times from the workers' spawn):"]
    lines += _storm_lines(tunnel["cold_start"], agents)
    storm = tunnel.get("restart")
    if storm is not None:
        health, after = storm["healthz_seconds"], storm["server_rss_after_kib"]
        lines += [
            "",
            f"Restart ({storm['signal']}, started again at once on the same port and state dir;"
            " times from the kill):",
            f"  server answering /healthz again after     {storm['server_ready_seconds']:.2f} s",
            *_storm_lines(storm, agents),
            "  /healthz latency p50 / max (new TLS conn) "
            + (
                f"{health['p50'] * 1000:.0f} / {health['max'] * 1000:.0f} ms"
                if health
                else "no sample"
            ),
            f"  server RSS after the storm                {after['VmRSS'] * mib:.1f} MiB"
            f" (peak {after['VmHWM'] * mib:.1f} MiB)",
        ]
    if "tracemalloc" in tunnel:
        lines += [
            "",
            "Growth of the server's Python allocations (tracemalloc), before -> connected:",
        ]
        for entry in tunnel["tracemalloc"]:
            kind, size, where = entry.split("\t", 2)
            if kind in ("total", "file", "line", "traceback"):
                per_agent = int(size) / agents / KIB
                lines.append(f"  {kind:5} {per_agent:8.2f} KiB/agent  {where}")
    if "profile" in tunnel:
        what = "idle window" if results["profile"] == "idle" else "restart until all connected"
        lines += [
            "",
            f"Profile of the server's event loop, {what} (cProfile):",
        ]
        lines += [f"  {line}" for line in tunnel["profile"] if line.strip()][:40]
    lines += ["", f"command: {command}"]
    return "\n".join(lines)


# ------------------------------------------------------------------------ CLI


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_idle_agents",
        description="Idle cost of connected agents: server memory and CPU, and a restart storm.",
    )
    parser.add_argument("--agents", type=int, default=200, help="connected agents (N)")
    parser.add_argument("--processes", type=int, default=4, help="agent processes")
    parser.add_argument("--idle", type=float, default=30.0, help="idle window (s)")
    parser.add_argument("--settle", type=float, default=10.0, help="wait before measuring (s)")
    parser.add_argument("--backoff-base", type=float, default=1.0, help="agent back-off base (s)")
    parser.add_argument("--backoff-cap", type=float, default=300.0, help="agent back-off cap (s)")
    parser.add_argument(
        "--restart-signal",
        choices=["kill", "term"],
        default="kill",
        help="how the server goes down: SIGKILL (crash) or SIGTERM (GOAWAY)",
    )
    parser.add_argument(
        "--connect-timeout", type=float, default=300.0, help="longest wait for all to connect (s)"
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="global time limit (s)")
    parser.add_argument("--port", type=int, default=0, help="loopback port (default: a free one)")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "tunnel-bench-idle-agents",
        help="server state and agent credentials, kept between runs",
    )
    parser.add_argument("--skip-restart", action="store_true", help="no restart measurement")
    parser.add_argument("--skip-baseline", action="store_true", help="no plain aiohttp baseline")
    parser.add_argument(
        "--tracemalloc",
        type=int,
        default=0,
        metavar="FRAMES",
        help="trace the server's allocations (through a wrapper; inflates RSS) and print the top",
    )
    parser.add_argument(
        "--ssl-read-buffer",
        type=int,
        default=0,
        metavar="BYTES",
        help="experiment: asyncio's per-connection SSL read buffer in both servers (3.11: 256 KiB)",
    )
    parser.add_argument(
        "--handshake-limit",
        type=int,
        default=0,
        metavar="K",
        help="experiment: the tunnel server holds at most K TLS handshakes in progress",
    )
    parser.add_argument(
        "--profile",
        choices=["idle", "restart"],
        help="cProfile the server over the idle window, or from its restart until all connected",
    )
    parser.add_argument("--server-log-level", default="info", help="the tunnel server's log level")
    parser.add_argument("--json", type=Path, help="also write the results here as JSON")
    parser.add_argument("--keep-logs", action="store_true", help="keep the run's log directory")
    # Roles of the child processes the benchmark starts itself.
    hidden = argparse.SUPPRESS
    parser.add_argument(
        "--role",
        choices=["orchestrator", "worker", "baseline-server", "tunnel-server"],
        default="orchestrator",
        help=hidden,
    )
    parser.add_argument("--config", type=Path, help=hidden)
    parser.add_argument("--state-dir", type=Path, help=hidden)
    parser.add_argument("--serve-args", help=hidden)
    parser.add_argument("--dump", type=Path, help=hidden)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark (or, with the hidden --role, one of its child processes)."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(arguments)
    if args.role == "worker":
        return asyncio.run(_worker(json.loads(args.config.read_text())))
    if args.role == "baseline-server":
        _raise_nofile()
        _set_ssl_read_buffer(args.ssl_read_buffer)
        asyncio.run(_baseline_server(args.port, args.state_dir))
        return 0
    if args.role == "tunnel-server":
        _raise_nofile()
        if args.tracemalloc:
            tracemalloc.start(args.tracemalloc)
        _set_ssl_read_buffer(args.ssl_read_buffer)
        asyncio.run(_serve_experiment(args))
        return 0
    if args.agents < 1 or args.processes < 1:
        print("--agents and --processes must be at least 1", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    command = shlex.join([".venv/bin/python", "-m", _MODULE, *arguments])
    run_dir = Path(tempfile.mkdtemp(prefix="bench-idle-agents-"))
    print(f"logs in {run_dir}")
    try:
        results = asyncio.run(_orchestrate(args, run_dir))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print(f"interrupted; every process it started has ended; logs in {run_dir}")
        return 130
    except (BenchError, AgentError, OSError) as exc:
        print(f"bench_idle_agents: {exc}; logs in {run_dir}", file=sys.stderr)
        return 1
    results["command"] = command
    print()
    print(_report(results, command))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
    if not args.keep_logs:
        shutil.rmtree(run_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
