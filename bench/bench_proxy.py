"""The Kubernetes API proxy against direct calls and an OpenSSH reverse tunnel.

One upstream HTTP server (:mod:`bench.proxy_upstream`, its own process)
stands in for the API server. In one run, the same client programs call it
by each of these paths, all on 127.0.0.1:

- ``direct``: client -> upstream, plain HTTP;
- ``direct-tls``: client -> upstream over TLS (the tunnel server's certificate
  and key), so that the tunnel's own TLS hop has a fair baseline;
- ``tunnel``: client -> ``tunnel-server serve`` (HTTPS) -> the agent's one
  mTLS WebSocket -> agent (:mod:`bench.proxy_agent`) -> upstream (HTTP);
- ``py-relay`` (with ``--floor``): the same hops through the cheapest Python
  relay there is (:mod:`bench.relay_floor`): client -> near end (HTTPS, the
  tunnel server's certificate) -> one TLS connection dialled out by the far
  end, bare multiplexing -> far end -> upstream (HTTP); the floor under any
  Python relay here, whatever its application logic;
- ``mux-relay`` (with ``--floor``): py-relay with the product's multiplexing
  layer in place of its bare one (:mod:`bench.mux_floor`): the same hops, but
  the far end dials a WebSocket (aiohttp) and the two ends run a
  ``tunnel_mux.Session`` over it, per-stream credit and all, with no HTTP
  parsing, auth or audit on top; what it adds to py-relay is the multiplexing
  layer's cost, what the tunnel adds to it the application's;
- ``ssh``: client -> sshd -> ``ssh -tt -R`` client -> upstream, HTTP inside
  SSH (Nagle off at both ends, see :mod:`bench.proxy_ssh`);
- ``ssh -N``: the same with ``ssh -tt -N -R`` (sshd keeps Nagle on).

For each path it measures: small GET (a ~500-byte Pod) latency at
concurrency 1 (wrk, p50/p99, after a warm-up); requests/s at concurrency 64
(wrk, one thread) with the CPU each process spent per request; the throughput
of a 100 MiB response (curl); N watches held open, then one event delivered
to all (time until the last has it; memory of the relays with all open); and
the small-request latency while 100 MiB downloads run back to back on the
same path. Then it samples the tunnel's server and agent with py-spy under
the concurrency-64 load. Every figure is also given as a ratio to ``direct``.

The machine's cores are shared by the client, the relays (server and agent,
or sshd and ssh) and the upstream; nothing is pinned. Every child process is
ended when the benchmark ends, fails, is interrupted or runs out of time.

    .venv/bin/python -m bench.bench_proxy --quick     # smoke run, about a minute
    .venv/bin/python -m bench.bench_proxy             # full run, about five minutes
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from .procs import BenchError, Children
from .proxy_costs import cores_busy, cpu_per, cpu_snapshot, rss_kib
from .proxy_load import Target, WrkResult, bulk, bulk_loop, write_wrk_script, wrk
from .proxy_options import MIB, Plan, jsonable, parser, wait_quiet
from .proxy_profile import Profile, py_spy, record, summarise
from .proxy_report import report
from .proxy_setup import (
    Experiment,
    RelayFloor,
    Tunnel,
    Upstream,
    ensure_tools,
    environment,
    start_agent,
    start_relay_floor,
    start_server,
    start_upstream,
)
from .proxy_ssh import VARIANTS, SshBaseline, start_ssh
from .proxy_upstream import BULK_PATH, POD_PATH, WATCH_PATH

__all__ = ["Plan", "main"]

_MODULE = "bench.bench_proxy"
#: The pace of the bulk downloads in the "paced" phase: about a 1 Gbit/s link.
PACED_RATE = 100 * MIB


@dataclass
class Route:
    """One path to the upstream, and the processes that relay on it."""

    target: Target
    #: Process groups whose CPU and memory are this path's cost, by name.
    groups: dict[str, list[int]]
    results: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.target.name


class Bench:
    """Everything one run needs: its children, the paths, and what they measured."""

    def __init__(
        self, plan: Plan, children: Children, run_dir: Path, http: aiohttp.ClientSession
    ) -> None:
        self.plan = plan
        self.children = children
        self.run_dir = run_dir
        self.http = http
        self.script = write_wrk_script(run_dir)
        self.upstream: Upstream | None = None
        self.tunnel: Tunnel | None = None
        self.floor: RelayFloor | None = None
        self.mux_floor: RelayFloor | None = None
        self.ssh: SshBaseline | None = None
        self.routes: list[Route] = []

    # ------------------------------------------------------------ helpers

    def _groups(self, route: Route) -> dict[str, list[int]]:
        if self.ssh is not None and route.name in self.ssh.clients:
            groups = self.ssh.pids(route.name)  # sshd forks per connection: look again
        else:
            groups = dict(route.groups)
        assert self.upstream is not None
        return {**groups, "upstream": [self.upstream.process.pid]}

    def _cpu(self, route: Route) -> dict[str, float]:
        return cpu_snapshot(self._groups(route))

    def _rss_kib(self, route: Route) -> dict[str, int]:
        return rss_kib(self._groups(route))

    async def _upstream_stats(self) -> dict[str, int]:
        assert self.upstream is not None
        async with self.http.get(self.upstream.url + "/control/stats") as answer:
            stats: dict[str, int] = await answer.json()
            return stats

    async def _wrk(
        self, route: Route, path: str, connections: int, seconds: float, label: str
    ) -> WrkResult:
        return await wrk(
            self.children,
            self.script,
            route.target,
            path,
            connections=connections,
            seconds=seconds,
            label=f"{label}-{route.name.replace(' ', '')}",
        )

    # ------------------------------------------------------- measurements

    async def latency(self, route: Route, round_number: int) -> None:
        """Small GETs one at a time: warm-up, then about ``latency_requests`` of them."""
        plan = self.plan
        warm = await self._wrk(route, POD_PATH, 1, plan.warmup_seconds, "warm1")
        # Whole seconds for about 20 % more than latency_requests at the warm-up's rate.
        seconds = min(max(math.ceil(1.2 * plan.latency_requests / max(warm.rate, 1.0)), 1), 30)
        before = self._cpu(route)
        result = await self._wrk(route, POD_PATH, 1, seconds, "c1")
        rounds = route.results.setdefault("c1", [])
        rounds.append(
            {
                **asdict(result),
                "rate": result.rate,
                "cpu_us_per_request": cpu_per(before, self._cpu(route), result.requests, 1e6),
            }
        )
        print(
            f"  {route.name:11} round {round_number + 1}: {result.requests} requests, "
            f"p50 {result.p50 / 1000:.3f} ms, p99 {result.p99 / 1000:.3f} ms",
            flush=True,
        )

    async def rate(self, route: Route, round_number: int) -> None:
        """Requests/s at concurrency 64 (after a warm-up at the same concurrency)."""
        plan = self.plan
        await self._wrk(route, POD_PATH, 64, plan.warmup_seconds, "warm64")
        before = self._cpu(route)
        result = await self._wrk(route, POD_PATH, 64, plan.rate_seconds, "c64")
        after = self._cpu(route)
        rounds = route.results.setdefault("c64_rounds", [])
        rounds.append(
            {
                **asdict(result),
                "rate": result.rate,
                "cpu_us_per_request": cpu_per(before, after, result.requests, 1e6),
                "cores_busy": cores_busy(before, after, result.seconds),
            }
        )
        # The figure reported: all rounds together; latency and CPU from the median round.
        middle = sorted(rounds, key=lambda r: float(r["rate"]))[(len(rounds) - 1) // 2]
        requests = sum(int(r["requests"]) for r in rounds)
        seconds = sum(float(r["seconds"]) for r in rounds)
        route.results["c64"] = {**middle, "rate": requests / seconds, "requests": requests}
        print(
            f"  {route.name:11} round {round_number + 1}: {result.rate:10,.0f} requests/s, "
            f"p50 {result.p50 / 1000:.2f} ms",
            flush=True,
        )

    async def bulk(self, route: Route) -> None:
        """One download of ``bulk_bytes``: its throughput and CPU per GB."""
        plan = self.plan
        before = self._cpu(route)
        runs = await bulk(
            self.children,
            route.target,
            f"{BULK_PATH}?size={plan.bulk_bytes}",
            size=plan.bulk_bytes,
            count=1,
            label=f"bulk-{route.name.replace(' ', '')}",
        )
        after = self._cpu(route)
        done = route.results.setdefault("bulk_rounds", [])
        done.append(
            {
                "mb_per_s": runs[0].mb_per_s,
                # CPU seconds per GB (10^9 bytes) moved.
                "cpu_s_per_gb": cpu_per(before, after, runs[0].size, 1e9),
            }
        )
        middle = sorted(done, key=lambda r: float(r["mb_per_s"]))[(len(done) - 1) // 2]
        route.results["bulk"] = {**middle, "runs_mb_per_s": [r["mb_per_s"] for r in done]}
        print(f"  {route.name:11} {runs[0].mb_per_s:8,.0f} MB/s", flush=True)

    async def watches(self, route: Route) -> None:
        """N watches open at once, then one event to all of them."""
        count = self.plan.watches
        target = route.target
        argv = [sys.executable, "-m", "bench.proxy_watch", target.url(WATCH_PATH)]
        argv += ["--count", str(count), "--concurrency", "64"]
        for name, value in target.headers:
            argv += ["--header", f"{name}: {value}"]
        if target.cafile is not None:
            argv += ["--cafile", str(target.cafile)]
        rss_before = self._rss_kib(route)
        client = await self.children.start(
            f"watch-{route.name.replace(' ', '')}", argv, stdin=True, stdout=True
        )
        result: dict[str, Any] = {"count": count, "rss_before_kib": rss_before}
        route.results["watches"] = result
        try:
            opened = await _line(client, 300.0, "the watch client")
            result["established"] = opened["established"]
            result["establish_seconds"] = opened["seconds"]
            if opened["failed"]:
                result["errors"] = opened["errors"]
                print(f"  {route.name:11} {opened['failed']} watches failed: {opened['errors']}")
                return
            stats = await self._upstream_stats()
            if stats["watchers"] != count:
                raise BenchError(f"the upstream holds {stats['watchers']} watches, not {count}")
            result["rss_open_kib"] = self._rss_kib(route)
            emitted = time.monotonic()
            assert self.upstream is not None
            async with self.http.post(self.upstream.url + "/control/emit") as answer:
                reached = (await answer.json())["watchers"]
            try:
                delivered = await _line(client, 60.0, "the watch client")
            except BenchError:
                _send(client, "report")
                delivered = await _line(client, 30.0, "the watch client")
            result["reached"] = reached
            result["received"] = delivered["received"]
            for key in ("first", "median", "p99", "last"):
                if delivered[key] is not None:
                    result[f"{key}_ms"] = (delivered[key] - emitted) * 1000
            print(
                f"  {route.name:11} {delivered['received']}/{count} events, last after "
                f"{result.get('last_ms', float('nan')):.1f} ms; opened in "
                f"{opened['seconds']:.1f} s",
                flush=True,
            )
        finally:
            _send(client, "close")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(client.wait(), 30.0)
            await self.children.stop(client)
            await self._wait_watches_closed(result)

    async def _wait_watches_closed(self, result: dict[str, Any]) -> None:
        """Wait until the upstream has no watch open; note how many outlived their client.

        A relay that only notices a departed client when it next writes to it
        keeps the upstream watch open until events come: emit some, and count
        how many it took.
        """
        result["open_5s_after_close"] = await self._watchers_after(5.0)
        result["events_to_release"] = 0
        assert self.upstream is not None
        for events in range(1, 4):
            if not await self._watchers_after(5.0):
                return
            async with self.http.post(self.upstream.url + "/control/emit") as answer:
                await answer.read()
            result["events_to_release"] = events
        if await self._watchers_after(5.0):
            raise BenchError("the upstream still holds watches after 3 more events")

    async def _watchers_after(self, seconds: float) -> int:
        """Watches still open upstream once they are all closed, or ``seconds`` passed."""
        deadline = time.monotonic() + seconds
        while (open_now := (await self._upstream_stats())["watchers"]) > 0:
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        return open_now

    async def loaded(self, route: Route, rate: int | None = None) -> None:
        """Small-request latency while 100 MiB downloads run back to back on the same path.

        With ``rate`` (bytes/s) the downloads are paced ("loaded_paced"): a
        bulk stream that leaves the CPU some room, as one behind a real
        network link does, so what remains is what the path adds, not what
        two saturated cores do to every process.
        """
        plan = self.plan
        seconds = plan.loaded_seconds
        path = f"{BULK_PATH}?size={plan.bulk_bytes}"
        key = "loaded" if rate is None else "loaded_paced"
        label = f"{key}-{route.name.replace(' ', '')}"
        async with bulk_loop(
            self.children, route.target, path, size=plan.bulk_bytes, label=label, rate=rate
        ) as runs:
            await self._wait_bulk_flowing()
            start_bytes, started = (await self._upstream_stats())["bulk_bytes"], time.monotonic()
            result = await self._wrk(route, POD_PATH, 1, seconds, f"c1-{key}")
            moved = (await self._upstream_stats())["bulk_bytes"] - start_bytes
            elapsed = time.monotonic() - started
        route.results[key] = {
            **asdict(result),
            "bulk_mb_per_s": moved / elapsed / 1e6,
            "bulk_downloads_completed": len(runs),
        }
        print(
            f"  {route.name:11} p50 {result.p50 / 1000:.3f} ms, p99 {result.p99 / 1000:.3f} ms "
            f"with bulk at {moved / elapsed / 1e6:,.0f} MB/s",
            flush=True,
        )

    async def _wait_bulk_flowing(self) -> None:
        first = (await self._upstream_stats())["bulk_bytes"]
        deadline = time.monotonic() + 30.0
        while (await self._upstream_stats())["bulk_bytes"] - first < 16 * MIB:
            if time.monotonic() > deadline:
                raise BenchError("the bulk download did not start within 30 s")
            await asyncio.sleep(0.05)

    async def _sample(self, label: str, tool: str, gil: bool) -> list[Profile]:
        """py-spy the server and the agent at the same time, for ``profile_seconds``."""
        assert self.tunnel is not None
        seconds = self.plan.profile_seconds
        pids = {"server": self.tunnel.server.pid, "agent": self.tunnel.agent.pid}
        raws = await asyncio.gather(
            *(
                record(self.children, tool, pid, f"{label}-{name}", seconds, self.run_dir, gil=gil)
                for name, pid in pids.items()
            )
        )
        return [summarise(name, raw) for name, raw in zip(pids, raws, strict=True)]

    async def profile(self, route: Route, tool: str, gil: bool) -> None:
        """py-spy the server and the agent under the concurrency-64 load, then under bulk."""
        seconds = self.plan.profile_seconds
        load = asyncio.create_task(self._wrk(route, POD_PATH, 64, seconds + 4, "profile"))
        try:
            await asyncio.sleep(2.0)  # the load reaches its steady state first
            profiles = await self._sample("c64", tool, gil)
            result = await load
        finally:
            if not load.done():
                load.cancel()
                await asyncio.gather(load, return_exceptions=True)
        route.results["profile"] = {"rate": result.rate, "gil": gil, "profiles": profiles}
        path = f"{BULK_PATH}?size={self.plan.bulk_bytes}"
        async with bulk_loop(
            self.children, route.target, path, size=self.plan.bulk_bytes, label="profile-bulk"
        ):
            await self._wait_bulk_flowing()
            start, started = (await self._upstream_stats())["bulk_bytes"], time.monotonic()
            profiles = await self._sample("bulk", tool, gil)
            moved = (await self._upstream_stats())["bulk_bytes"] - start
            elapsed = time.monotonic() - started
        route.results["profile_bulk"] = {
            "mb_per_s": moved / elapsed / 1e6,
            "gil": gil,
            "profiles": profiles,
        }

    # ----------------------------------------------------------- the run

    async def setup(
        self, ssh: bool, log_level: str, experiment: Experiment, *, floor: bool = False
    ) -> None:
        print("starting the tunnel server, the upstream and the agent ...", flush=True)
        state = self.run_dir / "state"
        # The upstream's TLS port serves the tunnel server's certificate: server first.
        server, port = await start_server(self.children, state, log_level, experiment)
        self.upstream = await start_upstream(
            self.children, state / "server.crt", state / "server.key"
        )
        tunnel = await start_agent(
            self.children, self.run_dir, server, port, self.upstream.url, experiment
        )
        self.tunnel = tunnel
        auth = (("Authorization", f"Bearer {tunnel.user_token}"),)
        self.routes = [
            Route(Target("direct", self.upstream.url), {}),
            Route(Target("direct-tls", self.upstream.tls_url, cafile=tunnel.ca_file), {}),
            Route(
                Target("tunnel", tunnel.base, auth, tunnel.ca_file),
                {"server": [tunnel.server.pid], "agent": [tunnel.agent.pid]},
            ),
        ]
        if floor:
            print("starting the relay floor (near end, then far end) ...", flush=True)
            self.floor = await start_relay_floor(self.children, state, self.upstream.port)
            self.routes.append(
                Route(
                    Target("py-relay", self.floor.url, cafile=tunnel.ca_file),
                    {"near": [self.floor.near.pid], "far": [self.floor.far.pid]},
                )
            )
            print("starting the mux floor (near end, then far end) ...", flush=True)
            mux = await start_relay_floor(
                self.children, state, self.upstream.port, module="bench.mux_floor", label="mux"
            )
            self.mux_floor = mux
            self.routes.append(
                Route(
                    Target("mux-relay", mux.url, cafile=tunnel.ca_file),
                    {"near": [mux.near.pid], "far": [mux.far.pid]},
                )
            )
        if ssh:
            print("starting sshd and the ssh -R clients ...", flush=True)
            self.ssh = await start_ssh(
                self.children, self.run_dir / "ssh", self.upstream.port, list(VARIANTS)
            )
            for variant, (_, port) in self.ssh.clients.items():
                self.routes.append(Route(Target(variant, f"http://127.0.0.1:{port}"), {}))

    async def measure(self, skip: set[str], profile_tool: str | None, gil: bool) -> None:
        plan = self.plan
        print(f"latency at concurrency 1 ({plan.latency_rounds} rounds, paths interleaved):")
        for number in range(plan.latency_rounds):
            for route in self.routes:
                await self.latency(route, number)
        if "watches" not in skip:
            print(f"{plan.watches} watches, then one event to all:")
            for route in self.routes:
                await self.watches(route)
        if "rate" not in skip:
            print(
                f"requests/s at concurrency 64 ({plan.rate_rounds} rounds of "
                f"{plan.rate_seconds} s, paths interleaved):"
            )
            for number in range(plan.rate_rounds):
                for route in self.routes:
                    await self.rate(route, number)
        if "bulk" not in skip:
            print(f"bulk: {plan.bulk_count} x {plan.bulk_bytes // MIB} MiB, paths interleaved:")
            for _ in range(plan.bulk_count):
                for route in self.routes:
                    await self.bulk(route)
        if "loaded" not in skip:
            print(
                f"latency at concurrency 1 ({plan.loaded_seconds} s) during back-to-back bulk "
                "downloads:"
            )
            for route in self.routes:
                await self.loaded(route)
        if "paced" not in skip:
            print(
                f"latency at concurrency 1 ({plan.loaded_seconds} s) during bulk downloads paced "
                f"at {PACED_RATE // MIB} MiB/s:"
            )
            for route in self.routes:
                await self.loaded(route, rate=PACED_RATE)
        tunnel = next((route for route in self.routes if route.name == "tunnel"), None)
        if profile_tool is not None and "profile" not in skip and tunnel is not None:
            print(
                f"profiling the tunnel's server and agent for {plan.profile_seconds} s "
                "under concurrency 64, then under bulk ..."
            )
            await self.profile(tunnel, profile_tool, gil)


async def _line(process: asyncio.subprocess.Process, within: float, what: str) -> dict[str, Any]:
    assert process.stdout is not None
    try:
        line = await asyncio.wait_for(process.stdout.readline(), within)
    except TimeoutError as exc:
        raise BenchError(f"{what} did not answer within {within:.0f} s") from exc
    if not line:
        raise BenchError(f"{what} exited (status {process.returncode}); see its log")
    answer: dict[str, Any] = json.loads(line)
    return answer


def _send(process: asyncio.subprocess.Process, command: str) -> None:
    if process.stdin is not None and not process.stdin.is_closing():
        with contextlib.suppress(ConnectionError):
            process.stdin.write(command.encode() + b"\n")


async def _run(args: argparse.Namespace, plan: Plan, run_dir: Path) -> dict[str, Any]:
    children = Children(run_dir)
    results: dict[str, Any] = {"environment": environment(), "plan": asdict(plan)}
    results["load_average_at_start"] = os.getloadavg()
    tool = None if args.no_profile else py_spy()
    # SIGTERM and SIGHUP end the run as Ctrl-C does: through the cleanup below.
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(signum, task.cancel)
    try:
        async with asyncio.timeout(args.timeout), aiohttp.ClientSession() as http:
            bench = Bench(plan, children, run_dir, http)
            experiment = Experiment(
                args.window, args.frame_size, args.event_loop, args.shared_window
            )
            results["experiment"] = asdict(experiment) if experiment.active else None
            await bench.setup(not args.no_ssh, args.server_log_level, experiment, floor=args.floor)
            results["ssh_cipher"] = bench.ssh.cipher if bench.ssh is not None else None
            if args.paths:
                wanted = {"direct", *args.paths.split(",")}
                bench.routes = [route for route in bench.routes if route.name in wanted]
            started = time.monotonic()
            skip = set(args.skip.split(",")) if args.skip else set()
            await bench.measure(skip, tool, gil=not args.profile_wall)
            results["measure_seconds"] = time.monotonic() - started
            results["routes"] = {route.name: route.results for route in bench.routes}
    except TimeoutError as exc:
        raise BenchError(
            f"the benchmark did not finish within --timeout {args.timeout:g} s"
        ) from exc
    finally:
        await asyncio.shield(children.stop_all())
    results["load_average_at_end"] = os.getloadavg()
    results["profiler"] = tool or "none (pip install py-spy into the venv to profile)"
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print its report."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(arguments)
    plan = Plan.quick() if args.quick else Plan()
    if args.watches is not None:
        plan = Plan(**{**asdict(plan), "watches": max(1, args.watches)})
    command = shlex.join([".venv/bin/python", "-m", _MODULE, *arguments])
    try:
        ensure_tools(install=not args.no_install, ssh=not args.no_ssh)
    except BenchError as exc:
        print(f"bench_proxy: {exc}", file=sys.stderr)
        return 1
    wait_quiet(args.wait_quiet, args.quiet_load)
    run_dir = Path(tempfile.mkdtemp(prefix="bench-proxy-"))
    print(f"run directory (logs): {run_dir}")
    try:
        results = asyncio.run(_run(args, plan, run_dir))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print(f"interrupted; every process it started has ended; logs in {run_dir}")
        return 130
    except (BenchError, OSError, aiohttp.ClientError) as exc:
        print(f"bench_proxy: {exc}; logs in {run_dir}", file=sys.stderr)
        return 1
    results["command"] = command
    results["run_dir"] = str(run_dir) if args.keep else None
    print()
    print(report(results))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2, default=jsonable) + "\n")
    if not args.keep:
        shutil.rmtree(run_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
