"""What a proxy-benchmark run does: the plan, the command line, and small run helpers."""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from pathlib import Path

from tunnel_cli import EVENT_LOOPS

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Plan:
    """How much of each measurement to do."""

    latency_requests: int = 2000
    latency_rounds: int = 3
    warmup_seconds: int = 2
    rate_rounds: int = 2
    rate_seconds: int = 5
    bulk_bytes: int = 100 * MIB
    bulk_count: int = 3
    loaded_seconds: int = 5
    watches: int = 1000
    profile_seconds: int = 5

    @classmethod
    def quick(cls) -> Plan:
        return cls(
            latency_requests=300,
            latency_rounds=1,
            warmup_seconds=1,
            rate_rounds=1,
            rate_seconds=2,
            bulk_bytes=100 * MIB,
            bulk_count=1,
            loaded_seconds=2,
            watches=100,
            profile_seconds=2,
        )


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_proxy",
        description="The Kubernetes API proxy against direct calls and ssh -R, on loopback.",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run (about a minute)")
    parser.add_argument("--watches", type=int, help="watches held open (default 1000; quick 100)")
    parser.add_argument("--no-ssh", action="store_true", help="skip the OpenSSH baseline")
    parser.add_argument("--no-profile", action="store_true", help="skip the py-spy profiles")
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also measure py-relay: the cheapest Python relay over the tunnel's hops "
        "(bench/relay_floor.py), the floor under any Python relay here; and mux-relay: "
        "the same over the product's multiplexing layer (bench/mux_floor.py)",
    )
    parser.add_argument(
        "--profile-wall",
        action="store_true",
        help="sample wall-clock time of busy threads rather than the GIL holder",
    )
    parser.add_argument(
        "--skip",
        default="",
        help="comma-separated phases to skip: watches, rate, bulk, loaded, paced, profile",
    )
    parser.add_argument(
        "--paths",
        default="",
        help="comma-separated paths to measure (direct always is): direct-tls, tunnel, py-relay "
        "and mux-relay (with --floor), ssh, ssh -N",
    )
    parser.add_argument(
        "--no-install", action="store_true", help="never apt-get install missing tools"
    )
    parser.add_argument("--timeout", type=float, default=1200.0, help="global time limit (s)")
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="first wait up to this long for the machine to be quiet (see --quiet-load)",
    )
    parser.add_argument(
        "--quiet-load", type=float, default=1.0, help="1-minute load average counted as quiet"
    )
    parser.add_argument(
        "--server-log-level", default="warning", help="the tunnel server's log level"
    )
    parser.add_argument(
        "--window",
        type=int,
        default=0,
        metavar="BYTES",
        help="experiment: per-stream credit both sides announce (default 1 MiB)",
    )
    parser.add_argument(
        "--frame-size",
        type=int,
        default=0,
        metavar="BYTES",
        help="experiment: largest DATA frame both sides accept (default 64 KiB)",
    )
    parser.add_argument(
        "--shared-window",
        type=int,
        default=0,
        metavar="BYTES",
        help="experiment: credit a stream keeps while others are active (default 64 KiB; "
        "the --window value or more turns sharing off)",
    )
    parser.add_argument(
        "--event-loop",
        default="auto",
        choices=list(EVENT_LOOPS),
        help="the server's and the agent's event loop (default auto: uvloop when installed)",
    )
    parser.add_argument("--json", type=Path, help="also write the results here as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the run directory (logs)")
    return parser


def wait_quiet(seconds: float, load: float) -> None:
    """Wait up to ``seconds`` for the 1-minute load average to drop below ``load``."""
    deadline = time.monotonic() + seconds
    if seconds > 0 and os.getloadavg()[0] >= load:
        print(f"waiting up to {seconds:g} s for the load average to drop below {load:g} ...")
    while seconds > 0 and os.getloadavg()[0] >= load and time.monotonic() < deadline:
        time.sleep(5.0)


def jsonable(value: object) -> object:
    if hasattr(value, "__dataclass_fields__"):
        return {k: getattr(value, k) for k in value.__dataclass_fields__}
    return str(value)
