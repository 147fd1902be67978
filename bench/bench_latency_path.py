"""Where a small request's latency goes, hop by hop, at concurrency 1.

The real ``tunnel-server serve`` and the benchmark's agent run under
:mod:`bench.traced`, which timestamps each point a request passes (the caller's
bytes in, the tunnel message out and in, the request to the upstream and its
answer, the answer to the caller) on the clock both processes share. wrk sends
one request at a time; each request's points, in order, make a time line,
and the report gives each step's median and 90th percentile over all of them:

    .venv/bin/python -m bench.bench_latency_path                 # 5 s of wrk
    .venv/bin/python -m bench.bench_latency_path --seconds 10 --json out.json

The steps between two processes (a tunnel message from one to the other, the
upstream's round trip, the caller's) include the kernel's wake-up of the
receiving process; on a virtual machine that is a large part of them. Each
timestamp costs about half a microsecond, so the steps within one process
read a little high.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .harness import run_measurement, start_wrapped
from .procs import BenchError, Children, file_written
from .proxy_load import Target, write_wrk_script, wrk
from .proxy_upstream import POD_PATH

__all__ = ["PATH", "Step", "main", "steps_of"]

#: The points one request passes, in order: (process, point).
PATH = (
    ("server", "caller_in"),
    ("server", "tunnel_send"),
    ("server", "tunnel_sent"),
    ("agent", "tunnel_recv"),
    ("agent", "upstream_out"),
    ("agent", "upstream_in"),
    ("agent", "tunnel_send"),
    ("agent", "tunnel_sent"),
    ("server", "tunnel_recv"),
    ("server", "caller_out"),
)

#: What happens between a point and the next one.
STEP_NAMES = (
    "server: the caller's request, up to its message to the agent",
    "server: the message written to the tunnel",
    "tunnel: server to agent, until the agent has the message",
    "agent: the message, up to the request written to the upstream",
    "upstream: the request, until its answer reaches the agent",
    "agent: the answer, up to its message to the server",
    "agent: the message written to the tunnel",
    "tunnel: agent to server, until the server has the message",
    "server: the message, up to the answer written to the caller",
    "caller: the answer written, until its next request comes",
)

Record = tuple[int, str, str]  # (ns, process, point)


@dataclass(frozen=True, slots=True)
class Step:
    name: str
    p50_us: float
    p90_us: float


def steps_of(records: Sequence[Record]) -> tuple[int, list[Step]]:
    """The requests whose whole path was seen, and each step's percentiles.

    A time line starts at each ``caller_in`` of the server and takes the next
    point of :data:`PATH` as it comes, passing over any other record (a
    keep-alive PING's message, say); one that does not reach the end before
    the next request starts is left out. The last step ends at the next
    request's start.
    """
    ordered = sorted(records)
    lines: list[list[int]] = []
    current: list[int] | None = None
    for when, process, point in ordered:
        if (process, point) == PATH[0]:
            if current is not None and len(current) == len(PATH):
                current.append(when)  # the caller's step ends here
                lines.append(current)
            current = [when]
        elif (
            current is not None
            and len(current) < len(PATH)
            and (process, point) == PATH[len(current)]
        ):
            current.append(when)
    durations: list[list[float]] = [[] for _ in STEP_NAMES]
    for line in lines:
        for index in range(len(STEP_NAMES)):
            durations[index].append((line[index + 1] - line[index]) / 1000)
    if not lines:
        return 0, []
    steps = [
        Step(name, statistics.median(values), _percentile(values, 0.9))
        for name, values in zip(STEP_NAMES, durations, strict=True)
    ]
    return len(lines), steps


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def read_records(path: Path, process: str) -> list[Record]:
    records = []
    for line in path.read_text().splitlines():
        when, point = line.split()
        records.append((int(when), process, point))
    return records


def _traced(out: Path) -> list[str]:
    return [sys.executable, "-m", "bench.traced", "--out", str(out), "--"]


async def _measure(children: Children, run_dir: Path, seconds: float) -> dict[str, Any]:
    traces = run_dir / "traces"
    traces.mkdir()
    tunnel, upstream, target = await start_wrapped(
        children, run_dir, lambda name: _traced(traces / f"{name}.trace")
    )
    direct = Target("direct", upstream.url, (), None)
    script = write_wrk_script(run_dir)
    await wrk(children, script, target, POD_PATH, connections=1, seconds=2, label="warm")
    baseline = await wrk(children, script, direct, POD_PATH, connections=1, seconds=seconds,
                         label="direct")  # fmt: skip
    processes = {"server": tunnel.server, "agent": tunnel.agent}
    for process in processes.values():
        os.kill(process.pid, signal.SIGUSR1)
    result = await wrk(children, script, target, POD_PATH, connections=1, seconds=seconds,
                       label="traced")  # fmt: skip
    for process in processes.values():
        os.kill(process.pid, signal.SIGUSR2)
    records: list[Record] = []
    for name in processes:
        records += read_records(await file_written(traces / f"{name}.trace", "trace"), name)
    traced, steps = steps_of(records)
    if not traced:
        raise BenchError("no request's whole path was traced; see the logs")
    return {
        "requests": result.requests,
        "traced": traced,
        "p50_ms": result.p50 / 1000,
        "direct_p50_ms": baseline.p50 / 1000,
        "steps": [{"step": s.name, "p50_us": s.p50_us, "p90_us": s.p90_us} for s in steps],
    }


def _report(results: dict[str, Any]) -> None:
    print(
        f"\nc1 through the tunnel: p50 {results['p50_ms']:.3f} ms "
        f"(direct {results['direct_p50_ms']:.3f} ms); "
        f"{results['traced']} of {results['requests']} requests traced end to end\n"
    )
    print(f"  {'p50 us':>7} {'p90 us':>7}  step")
    for step in results["steps"]:
        print(f"  {step['p50_us']:7.1f} {step['p90_us']:7.1f}  {step['step']}")
    total = sum(step["p50_us"] for step in results["steps"])
    print(f"  {total:7.1f}          the medians' sum")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_latency_path", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--seconds", type=float, default=5.0, help="traced wrk run (s)")
    parser.add_argument("--json", type=Path, help="also write the results here as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the run directory (logs)")
    args = parser.parse_args(argv)
    return run_measurement(
        "bench_latency_path",
        args.keep,
        lambda children, run_dir: _measure(children, run_dir, args.seconds),
        _report,
        args.json,
    )


if __name__ == "__main__":
    sys.exit(main())
