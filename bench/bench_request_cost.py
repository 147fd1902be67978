"""The work one proxied request costs the server and the agent, counted rather than timed.

Timed figures on two shared cores move by about ±8 % from run to run, more
than most single changes to the request path save. This counts instead: the
real ``tunnel-server serve`` and the benchmark's agent run under cProfile
(:mod:`bench.profiled`), switched on for exactly the requests wrk sends
through the tunnel at each concurrency, and the report gives Python-level
calls per request in each process (the same for the same code within a few
per cent at concurrency 1) and the functions that make them. The time beside
them is cProfile's: inflated by the profiler, and wall time, so a write that
wakes another process on the same core also counts the time that process
runs; the calls are exact.

    .venv/bin/python -m bench.bench_request_cost                # c1 and c64, 3 s each
    .venv/bin/python -m bench.bench_request_cost --concurrency 1 --top 40
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pstats
import signal
import sys
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any

from .harness import run_measurement, start_wrapped
from .procs import Children, file_written
from .proxy_load import write_wrk_script, wrk
from .proxy_upstream import POD_PATH

__all__ = ["main"]


def _profiled(out: Path) -> list[str]:
    return [sys.executable, "-m", "bench.profiled", "--out", str(out), "--"]


async def _profile_file(path: Path) -> pstats.Stats:
    """The statistics a process writes (by rename) after SIGUSR2."""
    return await asyncio.to_thread(pstats.Stats, str(await file_written(path, "profile")))


def _summary(stats: pstats.Stats, requests: int, top: int) -> dict[str, Any]:
    """Calls per request, and the ``top`` functions by their own time, per request."""
    rows = []
    table: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    for (filename, line, name), (_, calls, own, _cumulative, _) in table.items():
        rows.append(
            {
                "function": f"{name} ({Path(filename).name}:{line})" if line else name,
                "calls_per_request": calls / requests,
                "own_us_per_request": own * 1e6 / requests,
            }
        )
    rows.sort(key=lambda row: -float(row["own_us_per_request"]))
    total_calls: int = stats.total_calls  # type: ignore[attr-defined]
    return {"calls_per_request": total_calls / requests, "top": rows[:top]}


async def _measure(
    children: Children, run_dir: Path, seconds: float, concurrencies: list[int], top: int
) -> dict[str, Any]:
    profiles = run_dir / "profiles"
    profiles.mkdir()
    tunnel, _, target = await start_wrapped(
        children, run_dir, lambda name: _profiled(profiles / f"{name}.prof")
    )
    script = write_wrk_script(run_dir)
    processes = {"server": tunnel.server, "agent": tunnel.agent}
    results: dict[str, Any] = {}
    for connections in concurrencies:
        await wrk(children, script, target, POD_PATH, connections=connections, seconds=2,
                  label=f"warm-c{connections}")  # fmt: skip
        for name, process in processes.items():
            (profiles / f"{name}.prof").unlink(missing_ok=True)
            os.kill(process.pid, signal.SIGUSR1)
        result = await wrk(children, script, target, POD_PATH, connections=connections,
                           seconds=seconds, label=f"c{connections}")  # fmt: skip
        for process in processes.values():
            os.kill(process.pid, signal.SIGUSR2)
        summaries = {
            name: _summary(await _profile_file(profiles / f"{name}.prof"), result.requests, top)
            for name in processes
        }
        results[f"c{connections}"] = {"requests": result.requests, **summaries}
        print(f"  c{connections}: {result.requests} requests profiled", flush=True)
    return results


def _report(results: dict[str, Any]) -> None:
    print("\nPython-level calls per request, on each process's event loop (cProfile):")
    for phase, figures in results.items():
        line = ", ".join(
            f"{name} {figures[name]['calls_per_request']:.0f}" for name in ("server", "agent")
        )
        print(f"  {phase:4} {line}  ({figures['requests']} requests)")
    for phase, figures in results.items():
        for name in ("server", "agent"):
            print(f"\n{name} at {phase}: own wall time (profiled) and calls, per request")
            for row in figures[name]["top"]:
                print(
                    f"  {row['own_us_per_request']:7.2f} us {row['calls_per_request']:6.2f}x  "
                    f"{row['function']}"
                )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_request_cost", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--seconds", type=float, default=3.0, help="profiled wrk run (s)")
    parser.add_argument("--concurrency", default="1,64", help="comma-separated (default 1,64)")
    parser.add_argument("--top", type=int, default=20, help="functions listed per process")
    parser.add_argument("--json", type=Path, help="also write the results here as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the run directory (logs)")
    args = parser.parse_args(argv)
    concurrencies = [int(part) for part in args.concurrency.split(",") if part]

    def measure(children: Children, run_dir: Path) -> Awaitable[dict[str, Any]]:
        return _measure(children, run_dir, args.seconds, concurrencies, args.top)

    return run_measurement("bench_request_cost", args.keep, measure, _report, args.json)


if __name__ == "__main__":
    sys.exit(main())
