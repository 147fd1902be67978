"""Command dispatch: latency from POST to the agent starting the job, and throughput.

The real ``tunnel-server serve`` runs in its own process; the agents run in
:mod:`bench.commands_agent` processes, each agent wired as ``tunnel-agent run``
wires it but with an executor that succeeds at once (so the figures are the
dispatch path's, not the Kubernetes API's). Every command goes through the
REST API and the server's SQLite store. The phases:

1. latency, one agent: after a warm-up, N commands one after another (each
   waits for its result to be acknowledged before the next POST); the client
   takes ``time.time()`` just before each POST, the agent's executor takes it
   as the job starts; p50/p99 of the difference;
2. throughput, one agent: S concurrent submitters POST for D seconds; the
   figure is the commands that reached ``succeeded`` (by the server's own
   ``finished_at``) within the window, per second;
3. the same across many agents (one cluster each) spread over a few
   processes: sequential latency, then throughput with the submitters
   spreading commands over the clusters;
4. the baseline, with the tunnel server stopped: the same POSTs to a trivial
   aiohttp endpoint on the same TLS settings that does one SQLite
   insert+commit (WAL, ``synchronous=NORMAL``, one database thread), i.e. what
   HTTP and the store alone cost; sequential latency and S-submitter rate.

Each phase starts with freshly connected agents. After each phase, when every
command is done, the server's ``/metrics`` must show no open stream; CPU time
of the server, the agents and the client comes from ``/proc``.

Everything listens on 127.0.0.1. Every child process dies with the benchmark
(``PR_SET_PDEATHSIG``) and is ended by its pid on success, failure, Ctrl-C
and when ``--timeout`` expires.

    .venv/bin/python -m bench.bench_commands --quick
    .venv/bin/python -m bench.bench_commands                       # the full run
    .venv/bin/python -m bench.bench_commands --profile             # py-spy the server
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shlex
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from .commands_load import AgentEvents, Client, percentiles
from .commands_procs import BenchError, Children, cpu_seconds
from .commands_report import (
    latency_figures,
    profile_summary,
    stored_commands,
    throughput_figures,
)
from .commands_setup import (
    Server,
    add_clusters,
    server_argv,
    start_agents,
    start_baseline,
    start_server,
)
from .commands_tables import report

__all__ = ["main"]

_API_PATH = "/api/v1/clusters/{cluster}/commands"
_BASELINE_PATH = "/clusters/{cluster}/commands"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_commands",
        description="Command dispatch latency and throughput through a real tunnel server.",
    )
    parser.add_argument("--quick", action="store_true", help="fewer commands, shorter windows")
    parser.add_argument("--commands", type=int, help="sequential commands measured (1000)")
    parser.add_argument("--warmup", type=int, help="sequential commands before measuring (100)")
    parser.add_argument("--duration", type=float, help="seconds of each throughput window (10)")
    parser.add_argument("--submitters", type=int, default=32, help="concurrent submitters (32)")
    parser.add_argument("--agents", type=int, help="agents (clusters) in phase 3 (100)")
    parser.add_argument("--agent-processes", type=int, default=4, help="processes of phase 3")
    parser.add_argument("--concurrency", type=int, default=8, help="jobs each agent runs at once")
    parser.add_argument("--drain", type=float, default=120.0, help="most seconds to drain")
    parser.add_argument(
        "--stall", type=float, default=15.0, help="give up draining after this long without news"
    )
    parser.add_argument("--timeout", type=float, help="the whole run's limit in seconds")
    parser.add_argument("--log-level", default="info", help="server and agents' log level")
    parser.add_argument("--profile", action="store_true", help="py-spy the server and an agent")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--keep", action="store_true", help="keep the run directory")
    return parser


def _defaults(args: argparse.Namespace) -> None:
    quick = args.quick
    for name, full, short in (
        ("commands", 1000, 200),
        ("warmup", 100, 30),
        ("duration", 10.0, 4.0),
        ("agents", 100, 100),
        ("timeout", 900.0, 360.0),
    ):
        if getattr(args, name) is None:
            setattr(args, name, short if quick else full)


def _environment() -> dict[str, Any]:
    model = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cores": os.cpu_count(),
        "cpu": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load_average_at_start": os.getloadavg()[0],
    }


class Run:
    """One benchmark run: its directory, children and figures."""

    def __init__(self, args: argparse.Namespace, run_dir: Path, children: Children) -> None:
        self.args = args
        self.dir = run_dir
        self.children = children
        self.events = AgentEvents()
        self.figures: dict[str, Any] = {"environment": _environment(), "settings": _settings(args)}

    @property
    def db(self) -> Path:
        return self.dir / "state" / "state.db"

    async def measure(self) -> dict[str, Any]:
        try:
            await self._tunnel()
        finally:
            await self.events.close()
        await self._baseline()
        return self.figures

    async def _tunnel(self) -> None:
        args = self.args
        server = await start_server(self.children, self.dir / "state", args.log_level)
        argv = server_argv(self.dir / "state", server.port, args.log_level)
        self.figures["server_command"] = shlex.join(argv)
        fleet = [f"fleet-{number:03d}" for number in range(args.agents)]
        tokens = await add_clusters(server, ["solo", *fleet])
        # Each phase starts with freshly connected agents, so that one phase's
        # streams and queues do not weigh on the next.
        solo = await self._agents(server, {"solo": tokens["solo"]}, 1, "solo")
        await self._latency(server, ["solo"], "one", solo)
        await self._stop_agents(solo, ["solo"])
        solo = await self._agents(server, {"solo": tokens["solo"]}, 1, "solo-again")
        await self._throughput(server, ["solo"], "one", solo)
        await self._stop_agents(solo, ["solo"])
        fleet_tokens = {name: tokens[name] for name in fleet}
        many = await self._agents(server, fleet_tokens, args.agent_processes, "fleet")
        await self._latency(server, fleet, "many", many)
        await self._stop_agents(many, fleet)
        many = await self._agents(server, fleet_tokens, args.agent_processes, "fleet-again")
        await self._throughput(server, fleet, "many", many)
        await self._stop_agents(many, fleet)
        await self.children.stop(server.process)

    async def _stop_agents(
        self, processes: list[asyncio.subprocess.Process], clusters: list[str]
    ) -> None:
        for process in processes:
            await self.children.stop(process)
        self.events.forget(clusters)

    async def _agents(
        self, server: Server, tokens: dict[str, str], processes: int, label: str
    ) -> list[asyncio.subprocess.Process]:
        began = time.monotonic()
        started = await start_agents(
            self.children,
            server,
            self.dir,
            tokens,
            processes=processes,
            concurrency=self.args.concurrency,
            events=self.events,
            label=label,
            log_level=self.args.log_level,
        )
        _say(f"{len(tokens)} agent(s) in {len(started)} process(es) connected", began)
        return started

    async def _latency(
        self,
        server: Server,
        clusters: list[str],
        label: str,
        agents: list[asyncio.subprocess.Process],
    ) -> None:
        args = self.args
        began = time.monotonic()
        load = os.getloadavg()[0]
        warm = max(args.warmup, len(clusters))  # every agent runs at least one first
        disconnects = self.events.disconnects
        pids = {"server": [server.process.pid], "agents": [p.pid for p in agents]}
        pids["client"] = [os.getpid()]
        async with Client(server.url, _API_PATH, server.token, server.context(), 1) as client:
            await client.sequential(clusters, [f"w{label}-{n}" for n in range(warm)], self.events)
            names = [f"l{label}-{n}" for n in range(args.commands)]
            spies = await self._spy(server, agents, f"latency_{label}")
            before = _cpu(pids)
            submissions = await client.sequential(clusters, names, self.events)
            after = _cpu(pids)
            await self._unspy(spies)
        figures = latency_figures(submissions, self.events, stored_commands(self.db, f"l{label}"))
        figures["clusters"] = len(clusters)
        figures["load_average_before"] = load
        figures["agent_disconnects"] = self.events.disconnects - disconnects
        figures["cpu_ms_per_command"] = {
            name: (after[name] - before[name]) * 1000.0 / len(names) for name in pids
        }
        # Every command here is finished and acknowledged: no stream should be open.
        figures["open_streams_after"] = await _open_streams(server)
        self.figures[f"latency_{label}"] = figures
        self._profiles(f"latency_{label}")
        _say(
            f"latency, {len(clusters)} agent(s): p50 {figures['dispatch_ms']['p50']:.2f} ms,"
            f" p99 {figures['dispatch_ms']['p99']:.2f} ms",
            began,
        )

    async def _throughput(
        self,
        server: Server,
        clusters: list[str],
        label: str,
        agents: list[asyncio.subprocess.Process],
    ) -> None:
        args = self.args
        prefix = f"t{label}"
        load = os.getloadavg()[0]
        pids = {"server": [server.process.pid], "agents": [p.pid for p in agents]}
        pids["client"] = [os.getpid()]
        spies = await self._spy(server, agents, f"throughput_{label}")
        disconnects = self.events.disconnects
        before = _cpu(pids)
        async with Client(
            server.url, _API_PATH, server.token, server.context(), args.submitters
        ) as client:
            start, submissions = await client.flood(
                clusters, prefix, args.submitters, args.duration
            )
        after = _cpu(pids)
        await self._unspy(spies)
        accepted = sum(1 for s in submissions if s.status == 201)
        drained, stalled = await self._drain(prefix, accepted, start + args.duration)
        figures = throughput_figures(
            start,
            args.duration,
            submissions,
            self.events,
            stored_commands(self.db, prefix),
            drained,
            {name: after[name] - before[name] for name in pids},
        )
        figures["clusters"] = len(clusters)
        figures["load_average_before"] = load
        figures["agent_disconnects"] = self.events.disconnects - disconnects
        figures["stalled_with_unfinished"] = stalled
        figures["open_streams_after"] = await _open_streams(server)
        self.figures[f"throughput_{label}"] = figures
        self._profiles(f"throughput_{label}")
        _say(
            f"throughput, {len(clusters)} agent(s): {figures['succeeded_per_s']:.0f} succeeded/s,"
            f" {figures['posts_per_s']:.0f} POSTs/s",
            time.monotonic() - args.duration,
        )

    async def _drain(self, prefix: str, accepted: int, end: float) -> tuple[float | None, int]:
        """Wait until every accepted command is acknowledged: (seconds after the window, 0),
        or (None, commands left) once nothing finishes for ``--stall`` s or ``--drain`` passes.
        """
        limit = time.monotonic() + self.args.drain
        done, moved = self.events.acked[prefix], time.monotonic()
        while done < accepted:
            now = time.monotonic()
            if now > limit or now - moved > self.args.stall:
                _say(f"warning: {accepted - done} commands never finished (stalled)", now)
                return None, accepted - done
            await asyncio.sleep(0.2)
            if self.events.acked[prefix] != done:
                done, moved = self.events.acked[prefix], time.monotonic()
        return time.time() - end, 0

    async def _spy(
        self, server: Server, agents: list[asyncio.subprocess.Process], tag: str
    ) -> list[asyncio.subprocess.Process]:
        """With --profile: py-spy the server and the first agent process until _unspy."""
        if not self.args.profile:
            return []
        spy = shutil.which("py-spy", path=f"{Path(sys.executable).parent}:{os.defpath}")
        if spy is None:
            raise BenchError("--profile needs py-spy: .venv/bin/pip install py-spy")
        started = []
        for name, pid in (("server", server.process.pid), ("agent", agents[0].pid)):
            argv = [spy, "record", "--pid", str(pid), "--rate", "200", "--format", "raw"]
            argv += ["--nonblocking", "--threads", "--function"]
            argv += ["-o", str(self.dir / f"profile-{tag}-{name}.txt")]
            started.append(await self.children.start(f"py-spy-{tag}-{name}", argv))
        await asyncio.sleep(1.0)  # py-spy attaches before the phase begins
        return started

    async def _unspy(self, spies: list[asyncio.subprocess.Process]) -> None:
        """Stop the recorders; SIGINT makes py-spy write its file."""
        for spy in spies:
            spy.send_signal(signal.SIGINT)
        for spy in spies:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(spy.wait(), 30.0)
            await self.children.stop(spy)

    def _profiles(self, tag: str) -> None:
        """Add the summaries of the phase's py-spy files (if any) to its figures."""
        if self.args.profile:
            self.figures[tag]["profiles"] = {
                name: profile_summary(self.dir / f"profile-{tag}-{name}.txt")
                for name in ("server", "agent")
                if (self.dir / f"profile-{tag}-{name}.txt").exists()
            }

    async def _baseline(self) -> None:
        args = self.args
        began = time.monotonic()
        baseline = await start_baseline(self.children, self.dir / "state", self.dir)
        context = baseline.context()
        load = os.getloadavg()[0]
        async with Client(baseline.url, _BASELINE_PATH, "-", context, 1) as client:
            await client.sequential(["solo"], [f"wb-{n}" for n in range(args.warmup)], None)
            names = [f"lb-{n}" for n in range(args.commands)]
            submissions = await client.sequential(["solo"], names, None)
        latency = percentiles([(s.answered - s.sent) * 1000.0 for s in submissions])
        pids = {"baseline": [baseline.process.pid], "client": [os.getpid()]}
        before = _cpu(pids)
        async with Client(baseline.url, _BASELINE_PATH, "-", context, args.submitters) as client:
            start, flood = await client.flood(["solo"], "tb", args.submitters, args.duration)
        after = _cpu(pids)
        answered = [s for s in flood if s.status == 201]
        cpu = {name: after[name] - before[name] for name in pids}
        self.figures["baseline"] = {
            "post_ms": latency,
            "load_average_before": load,
            "posts_per_s": sum(1 for s in answered if s.sent < start + args.duration)
            / args.duration,
            "post_under_load_ms": percentiles([(s.answered - s.sent) * 1000.0 for s in answered]),
            "refused": len(flood) - len(answered),
            "cpu_s": cpu,
            "cpu_ms_per_post": {k: v * 1000.0 / max(len(answered), 1) for k, v in cpu.items()},
        }
        await self.children.stop(baseline.process)
        _say(f"baseline: {self.figures['baseline']['posts_per_s']:.0f} POSTs/s", began)


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("commands", "warmup", "duration", "submitters", "agents", "agent_processes")
    return {key: getattr(args, key) for key in (*keys, "concurrency", "log_level")}


async def _open_streams(server: Server) -> dict[str, float]:
    """The server's open streams by kind, from its /metrics."""
    prefix = 'tunnel_server_open_streams{kind="'
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{server.url}/metrics", ssl=server.context()) as answer,
    ):
        text = await answer.text()
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(prefix):
            labels, _, value = line.rpartition(" ")
            found[labels[len(prefix) : -2]] = float(value)
    return found


def _cpu(pids: dict[str, list[int]]) -> dict[str, float]:
    return {name: sum(cpu_seconds(pid) for pid in group) for name, group in pids.items()}


def _say(message: str, began: float) -> None:
    print(f"[{time.monotonic() - began:6.1f} s] {message}", file=sys.stderr, flush=True)


# -------------------------------------------------------------------- main


async def _run(args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    children = Children(run_dir / "logs")
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()

    def terminate() -> None:
        # One SIGTERM ends the run; more (timeout(1) also signals the group) change nothing.
        loop.remove_signal_handler(signal.SIGTERM)
        task.cancel()

    loop.add_signal_handler(signal.SIGTERM, terminate)
    try:
        return await asyncio.wait_for(Run(args, run_dir, children).measure(), args.timeout)
    except TimeoutError as exc:
        raise BenchError(f"the run took longer than --timeout {args.timeout:.0f} s") from exc
    finally:
        # Every child ends, even if the run is cancelled again meanwhile (a second Ctrl-C).
        stopping = asyncio.ensure_future(children.stop_all())
        interrupted = False
        while not stopping.done():
            try:
                await asyncio.shield(stopping)
            except asyncio.CancelledError:
                interrupted = True
        if interrupted:
            raise asyncio.CancelledError


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _defaults(args)
    command = shlex.join([".venv/bin/python", "-m", "bench.bench_commands", *sys.argv[1:]])
    run_dir = Path(tempfile.mkdtemp(prefix="bench-commands-"))
    (run_dir / "logs").mkdir()
    ok = False
    try:
        figures = asyncio.run(_run(args, run_dir))
        figures["command"] = command
        text = json.dumps(figures, indent=2, default=str)
        (run_dir / "figures.json").write_text(text)
        if args.json is not None:
            args.json.write_text(text)
        print(report(figures, command))
        ok = True
    except BenchError as exc:
        print(f"bench_commands: {exc} (logs in {run_dir / 'logs'})", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, asyncio.CancelledError):
        print(f"bench_commands: interrupted (logs in {run_dir / 'logs'})", file=sys.stderr)
        return 130
    finally:
        if ok and not args.keep:
            shutil.rmtree(run_dir, ignore_errors=True)
        elif ok:
            print(f"run directory kept: {run_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
