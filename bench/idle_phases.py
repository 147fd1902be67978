"""The measured phases: the tunnel server (cold start, idle, restart), then the baseline.

Each phase starts its server and the agent workers, waits until every
connection is up, then measures: RSS before and after, CPU over the idle
window, and for the tunnel server a restart storm (every agent's reconnection
time and the 503 + Retry-After answers it got). Times are
``time.monotonic()``, shared by every process on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

from .idle_procs import BenchError, Children, cpu_seconds, memory_kib
from .idle_server import baseline_server_argv, tunnel_server_argv
from .idle_setup import Api, HealthProbe, wait_healthy
from .idle_workers import Worker, start_workers, stop_workers, wait_all_connected

__all__ = ["baseline_phase", "tunnel_phase"]


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
    workers: list[Worker], since: float, first_attempts: int = 0
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
    args: argparse.Namespace, server_pid: int, workers: list[Worker], profile: Path | None = None
) -> dict[str, Any]:
    """Settle, then CPU over the idle window and RSS at both ends of it."""
    await asyncio.sleep(args.settle)
    pids = [worker.process.pid for worker in workers]
    rss_start = memory_kib(server_pid)
    if profile is not None:
        os.kill(server_pid, signal.SIGUSR2)  # start profiling
    server_cpu, workers_cpu = cpu_seconds(server_pid), sum(map(cpu_seconds, pids))
    started = time.monotonic()
    await asyncio.sleep(args.idle)
    elapsed = time.monotonic() - started
    server_cpu = cpu_seconds(server_pid) - server_cpu
    workers_cpu = sum(map(cpu_seconds, pids)) - workers_cpu
    statuses = await asyncio.gather(*(worker.ask("status") for worker in workers))
    profiled = {}
    if profile is not None:
        profiled["profile"] = await _ask_file(profile, server_pid, signal.SIGUSR2)
    return {
        **profiled,
        "idle_seconds": elapsed,
        "server_rss_settled_kib": rss_start,
        "server_rss_connected_kib": memory_kib(server_pid),
        "server_cpu_percent": 100 * server_cpu / elapsed,
        "workers_cpu_percent": 100 * workers_cpu / elapsed,
        "workers_rss_kib": sum(memory_kib(pid)["VmRSS"] for pid in pids),
        "workers_rss_before_kib": sum(int(status["rss_before_kib"]) for status in statuses),
        "connected_at_end": sum(int(status["connected"]) for status in statuses),
        "sessions": sum(int(status["sessions"]) for status in statuses),
    }


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


async def tunnel_phase(
    args: argparse.Namespace,
    children: Children,
    http: aiohttp.ClientSession,
    dirs: list[Path],
    port: int,
    run_dir: Path,
) -> dict[str, Any]:
    state = args.cache_dir / "state"
    url = f"https://127.0.0.1:{port}"
    idle = "idle" if args.profile == "idle" else None
    argv = tunnel_server_argv(args, state, port, run_dir, experiment=True, profile=idle)
    result: dict[str, Any] = {"server_argv": [*argv[:2], "serve", "..."]}
    print("tunnel server: starting it, then the agents ...")
    server = await children.start("tunnel-server-1", argv)
    await wait_healthy(HealthProbe(http, url, state / "ca.crt", server.pid), server)
    await asyncio.sleep(args.settle)
    result["server_rss_before_kib"] = memory_kib(server.pid)
    dump = run_dir / "tracemalloc.txt"
    if args.tracemalloc:
        await _ask_file(dump, server.pid, signal.SIGUSR1)
    server_cpu = cpu_seconds(server.pid)
    workers = await start_workers(args, children, dirs, "agents", url, run_dir)
    spawned = time.monotonic()
    done = await wait_all_connected(workers, args.connect_timeout, "cold start")
    server_cpu = cpu_seconds(server.pid) - server_cpu
    result["cold_start_all_connected_seconds"] = done - spawned
    cold = await _connection_times(workers, spawned, first_attempts=len(dirs))
    cold.update(
        {
            "all_connected_seconds": done - spawned,
            "server_cpu_seconds": server_cpu,
            "server_cpu_percent": 100 * server_cpu / (done - spawned),
            "workers_cpu_seconds": sum(cpu_seconds(w.process.pid) for w in workers),
        }
    )
    result["cold_start"] = cold
    profile = (run_dir / "profile.txt") if idle else None
    result.update(await _measure_idle(args, server.pid, workers, profile))
    result["api_connected"] = await Api(http, url, state).connected()
    if args.tracemalloc:
        result["tracemalloc"] = await _ask_file(dump, server.pid, signal.SIGUSR1)
    if args.skip_restart:
        return result

    how = signal.SIGKILL if args.restart_signal == "kill" else signal.SIGTERM
    print(f"tunnel server: restarting it ({how.name}) with {len(dirs)} agents connected ...")
    await asyncio.gather(*(worker.ask("mark") for worker in workers))
    killed = time.monotonic()
    workers_cpu = sum(cpu_seconds(worker.process.pid) for worker in workers)
    server.send_signal(how)
    await server.wait()
    down = time.monotonic()
    restart = "restart" if args.profile == "restart" else None
    argv = tunnel_server_argv(args, state, port, run_dir, experiment=True, profile=restart)
    server = await children.start("tunnel-server-2", argv)
    probe = HealthProbe(http, url, state / "ca.crt", server.pid)
    probing = asyncio.create_task(probe.run())
    try:
        done = await wait_all_connected(workers, args.connect_timeout, "restart")
    finally:
        probing.cancel()
        await asyncio.gather(probing, return_exceptions=True)
    server_cpu = cpu_seconds(server.pid)
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
            "workers_cpu_seconds": sum(cpu_seconds(w.process.pid) for w in workers) - workers_cpu,
            "healthz_seconds": _percentiles(probe.latencies),
            "server_rss_after_kib": memory_kib(server.pid),
            "api_connected": await Api(http, url, state).connected(),
        }
    )
    result["restart"] = storm
    await stop_workers(children, workers)
    return result


async def baseline_phase(
    args: argparse.Namespace,
    children: Children,
    http: aiohttp.ClientSession,
    dirs: list[Path],
    port: int,
    run_dir: Path,
) -> dict[str, Any]:
    state = args.cache_dir / "state"
    url = f"https://127.0.0.1:{port}"
    print("baseline: plain aiohttp WebSocket server, then the same number of connections ...")
    argv = baseline_server_argv(port, state, args.ssl_read_buffer or 0)
    server = await children.start("baseline-server", argv)
    await wait_healthy(HealthProbe(http, url, state / "ca.crt", server.pid), server)
    await asyncio.sleep(args.settle)
    result: dict[str, Any] = {"server_rss_before_kib": memory_kib(server.pid)}
    workers = await start_workers(args, children, dirs, "plain", url, run_dir)
    spawned = time.monotonic()
    done = await wait_all_connected(workers, args.connect_timeout, "baseline")
    result["cold_start_all_connected_seconds"] = done - spawned
    result.update(await _measure_idle(args, server.pid, workers))
    await stop_workers(children, workers)
    return result
