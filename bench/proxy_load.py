"""Load generators of the proxy benchmark: ``wrk`` for small requests, ``curl`` for bulk.

Both are C programs, so the client's own cost stays small next to what is
measured, and the same client is used on every path. ``wrk`` reports its
latency percentiles (microsecond resolution, every request recorded) through
a small Lua ``done`` hook as one JSON line.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from .procs import BenchError, Children

__all__ = ["BulkRun", "Target", "WrkResult", "bulk", "bulk_loop", "write_wrk_script", "wrk"]

WRK = "/usr/bin/wrk"
#: Downloads one bulk_loop asks curl for: more than any path finishes in a measurement.
_LOOP_DOWNLOADS = 1000
CURL = "/usr/bin/curl"

_WRK_SCRIPT = """\
-- Written by bench/proxy_load.py: one JSON line with the run's figures.
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests": %d, "duration_us": %d, "bytes": %d, "connect": %d, "read": %d, ' ..
    '"write": %d, "status": %d, "timeout": %d, "p50": %d, "p90": %d, "p99": %d, ' ..
    '"p999": %d, "max": %d, "mean": %.1f}\\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write,
    e.status, e.timeout, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency:percentile(99.9), latency.max, latency.mean))
end
"""


@dataclass(frozen=True, slots=True)
class Target:
    """One way to the upstream: a URL prefix, headers to send, a CA to trust."""

    name: str
    base: str
    headers: tuple[tuple[str, str], ...] = ()
    cafile: Path | None = None

    def url(self, path: str) -> str:
        return self.base + path


@dataclass(frozen=True, slots=True)
class WrkResult:
    """What one wrk run measured; latencies in microseconds."""

    connections: int
    requests: int
    seconds: float
    errors: int
    p50: float
    p90: float
    p99: float
    p999: float
    max: float
    mean: float

    @property
    def rate(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0


def write_wrk_script(directory: Path) -> Path:
    path = directory / "report.lua"
    path.write_text(_WRK_SCRIPT)
    return path


async def wrk(
    children: Children,
    script: Path,
    target: Target,
    path: str,
    *,
    connections: int,
    seconds: float,
    label: str,
) -> WrkResult:
    """Run wrk (one thread) against ``target`` for whole ``seconds``; fail on any error."""
    duration = max(1, math.ceil(seconds))
    argv = [WRK, "-t1", f"-c{connections}", f"-d{duration}s", "--timeout", "10s", "-s", str(script)]
    for name, value in target.headers:
        argv += ["-H", f"{name}: {value}"]
    argv.append(target.url(path))
    output = await children.run(f"wrk-{label}", argv, within=duration + 30.0)
    line = next((x for x in reversed(output.splitlines()) if x.startswith("{")), None)
    if line is None:
        raise BenchError(f"wrk printed no result for {target.name}: {output[-300:]!r}")
    raw = json.loads(line)
    errors = sum(int(raw[key]) for key in ("connect", "read", "write", "status", "timeout"))
    result = WrkResult(
        connections=connections,
        requests=int(raw["requests"]),
        seconds=int(raw["duration_us"]) / 1e6,
        errors=errors,
        p50=float(raw["p50"]),
        p90=float(raw["p90"]),
        p99=float(raw["p99"]),
        p999=float(raw["p999"]),
        max=float(raw["max"]),
        mean=float(raw["mean"]),
    )
    if errors:
        raise BenchError(f"wrk saw {errors} errors on {target.name} ({label}): {raw}")
    return result


@dataclass(frozen=True, slots=True)
class BulkRun:
    """One bulk download: its size in bytes and wall time in seconds."""

    size: int
    seconds: float

    @property
    def mb_per_s(self) -> float:
        return self.size / self.seconds / 1e6 if self.seconds > 0 else 0.0


def _curl_argv(target: Target, path: str, count: int) -> list[str]:
    argv = [CURL, "-sS", "--http1.1", "--max-time", "600"]
    argv += ["-w", "%{http_code} %{size_download} %{time_total}\\n"]
    if target.cafile is not None:
        argv += ["--cacert", str(target.cafile)]
    for name, value in target.headers:
        argv += ["-H", f"{name}: {value}"]
    for _ in range(count):
        argv += ["-o", "/dev/null", target.url(path)]
    return argv


def _parse_curl(output: str, expected: int) -> list[BulkRun]:
    runs = []
    for line in output.splitlines():
        parts = line.split()
        if len(parts) != 3:
            continue
        code, size, seconds = int(parts[0]), int(parts[1]), float(parts[2])
        if code != 200 or size != expected:
            raise BenchError(f"a bulk download answered HTTP {code} with {size} bytes")
        runs.append(BulkRun(size, seconds))
    return runs


async def bulk(
    children: Children, target: Target, path: str, *, size: int, count: int, label: str
) -> list[BulkRun]:
    """Download ``size`` bytes ``count`` times on one connection; one BulkRun each."""
    output = await children.run(
        f"curl-{label}", _curl_argv(target, path, count), within=60.0 + 30.0 * count
    )
    runs = _parse_curl(output, size)
    if len(runs) != count:
        raise BenchError(f"curl finished {len(runs)} of {count} downloads on {target.name}")
    return runs


@contextlib.asynccontextmanager
async def bulk_loop(
    children: Children,
    target: Target,
    path: str,
    *,
    size: int,
    label: str,
    rate: int | None = None,
) -> AsyncIterator[list[BulkRun]]:
    """Download ``size`` bytes again and again on one connection while the block runs.

    With ``rate`` (bytes/s), curl paces the downloads to it. The list it
    yields fills, when the block ends, with the downloads that completed.
    """
    argv = _curl_argv(target, path, _LOOP_DOWNLOADS)
    if rate is not None:
        argv[1:1] = ["--limit-rate", str(rate)]
    process = await children.start(f"curl-{label}", argv, stdout=True)
    assert process.stdout is not None
    runs: list[BulkRun] = []
    try:
        yield runs
        ended_early = process.returncode is not None
    finally:
        await children.stop(process)
    runs.extend(_parse_curl((await process.stdout.read()).decode(), size))
    if ended_early:
        raise BenchError(f"the bulk downloads on {target.name} ended before the measurement did")
