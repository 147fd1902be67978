"""The server roles: the baseline server, and the tunnel server's experiments.

``--role baseline-server`` is a trivial aiohttp WebSocket server with the
tunnel server's TLS settings and key and no protocol on top: the floor our
memory and CPU per connection are compared with. ``--role tunnel-server`` is
``tunnel-server serve`` with the same settings in a wrapper that can trace its
allocations (SIGUSR1), profile it (SIGUSR2), shrink asyncio's SSL read buffer
or limit the TLS handshakes in progress. The ``*_argv`` functions build the
command lines the orchestrator starts them with.
"""

from __future__ import annotations

import argparse
import asyncio
import asyncio.sslproto
import cProfile
import io
import json
import pstats
import signal
import socket
import sys
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

from aiohttp import web

from protocol import Limits
from tunnel_pki.tls import server_context

from .idle_procs import MODULE, REPO

__all__ = [
    "BASELINE_HEARTBEAT",
    "baseline_server",
    "baseline_server_argv",
    "serve_experiment",
    "set_ssl_read_buffer",
    "tunnel_server_argv",
]

#: The baseline server pings like our default keepalive does.
BASELINE_HEARTBEAT = 15.0


def set_ssl_read_buffer(size: int | None) -> None:
    # asyncio's SSLProtocol zero-fills a read buffer of this size per connection
    # (256 KiB in 3.11): the experiment --ssl-read-buffer measures a smaller one.
    if size:
        asyncio.sslproto.SSLProtocol.max_size = size


async def _until_terminated() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()


async def _plain_healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _plain_websocket(request: web.Request) -> web.StreamResponse:
    # The agent socket's WebSocket settings (tunnel_server/agents/endpoint.py), no session on top.
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


async def baseline_server(port: int, state_dir: Path) -> None:
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


def baseline_server_argv(port: int, state: Path, ssl_read_buffer: int) -> list[str]:
    """The command line of the baseline server, on ``port`` with the key in ``state``."""
    argv = [sys.executable, "-m", MODULE, "--role", "baseline-server", "--port", str(port)]
    argv += ["--state-dir", str(state), "--ssl-read-buffer", str(ssl_read_buffer)]
    return argv


def _short_path(filename: str) -> str:
    for marker in ("site-packages/", "/lib/python3.", str(REPO) + "/"):
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
    from tunnel_server.clock import utcnow
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


async def serve_experiment(args: argparse.Namespace) -> None:
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


def tunnel_server_argv(
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
        wrapper = [sys.executable, "-m", MODULE, "--role", "tunnel-server", "--dump", str(run_dir)]
        wrapper += ["--serve-args", json.dumps(serve), "--tracemalloc", str(args.tracemalloc)]
        wrapper += ["--ssl-read-buffer", str(args.ssl_read_buffer)]
        wrapper += ["--handshake-limit", str(args.handshake_limit)]
        return wrapper + (["--profile", profile] if profile else [])
    script = Path(sys.executable).parent / "tunnel-server"
    if script.exists():
        return [str(script), *serve]
    return [sys.executable, "-m", "tunnel_server.cli", *serve]
