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

This module is the orchestrator, the report and the command line; the child
processes run its hidden ``--role`` modes. The parts: ``bench.idle_workers``
(the agent worker processes), ``bench.idle_server`` (the baseline server and
the tunnel server's experiments), ``bench.idle_setup`` (credentials and
health probes), ``bench.idle_phases`` (the measured phases) and
``bench.idle_procs`` (/proc figures; child processes from ``bench.procs``).

    .venv/bin/python -m bench.bench_idle_agents                 # 200 agents, quick
    .venv/bin/python -m bench.bench_idle_agents --agents 2000 --processes 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import shlex
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import tracemalloc
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from tunnel_agent.errors import AgentError

from .idle_phases import baseline_phase, tunnel_phase
from .idle_procs import MODULE, REPO, STOP_GRACE, BenchError, Children, free_port, raise_nofile
from .idle_server import baseline_server, serve_experiment, set_ssl_read_buffer
from .idle_setup import prepare
from .idle_workers import run_worker

__all__ = ["main"]

KIB = 1024
#: Targets from the issue (docs/benchmarks.md).
TARGET_KIB_PER_AGENT = 64.0
TARGET_RECONNECT_SECONDS = 30.0


# ----------------------------------------------------------------- orchestrator


def _environment() -> dict[str, Any]:
    revision = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
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
    children = Children(run_dir, stop_grace=STOP_GRACE)
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


async def _run(args: argparse.Namespace, children: Children, run_dir: Path) -> dict[str, Any]:
    soft, hard = raise_nofile()
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
    port = args.port or free_port()
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as http:
        dirs = await prepare(args, children, http, port, run_dir)
        try:
            results["tunnel"] = await tunnel_phase(args, children, http, dirs, port, run_dir)
        finally:
            await children.stop_all()
        if not args.skip_baseline:
            results["baseline"] = await baseline_phase(args, children, http, dirs, port, run_dir)
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
        return asyncio.run(run_worker(json.loads(args.config.read_text())))
    if args.role == "baseline-server":
        raise_nofile()
        set_ssl_read_buffer(args.ssl_read_buffer)
        asyncio.run(baseline_server(args.port, args.state_dir))
        return 0
    if args.role == "tunnel-server":
        raise_nofile()
        if args.tracemalloc:
            tracemalloc.start(args.tracemalloc)
        set_ssl_read_buffer(args.ssl_read_buffer)
        asyncio.run(serve_experiment(args))
        return 0
    if args.agents < 1 or args.processes < 1:
        print("--agents and --processes must be at least 1", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    command = shlex.join([".venv/bin/python", "-m", MODULE, *arguments])
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
