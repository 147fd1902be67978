"""Replicas on PostgreSQL: a request forwarded to the replica holding the agent, against
one the owner serves itself, in the same run.

Three ``tunnel-server serve`` processes share one fresh PostgreSQL database and
one CA; one agent (``bench.proxy_agent``) holds its socket on the first; the
upstream is ``bench.proxy_upstream``. ``wrk`` asks for the same small pod
through the first replica (owner-direct, the baseline) and through the second
(forwarded over the replicas' link), in alternating pairs, at concurrency 1
and 64. Reported: c1 p50 added by forwarding, and c64 requests/s forwarded as
a ratio to owner-direct (targets: at most 0.3 ms added; at least 0.6x).

    .venv/bin/python -m bench.bench_replicas            # 3 pairs of 5 s windows
    .venv/bin/python -m bench.bench_replicas --quick    # 1 pair of 3 s windows

The database: ``TUNNEL_TEST_POSTGRES`` (default postgresql://postgres@127.0.0.1:5432/postgres),
on which a database is created for the run and dropped after it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import uuid
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import asyncpg

from tunnel_pki.ca import CertificateAuthority
from tunnel_pki.tls import client_context

from .procs import BenchError, Children, free_port, wait_port
from .proxy_load import Target, WrkResult, write_wrk_script, wrk
from .proxy_setup import CLUSTER, USER, ensure_tools, start_upstream
from .proxy_upstream import POD_PATH

__all__ = ["main"]

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


async def _api(url: str, ca: bytes, token: str, method: str, path: str, body: Any) -> Any:
    async with (
        aiohttp.ClientSession() as http,
        http.request(
            method,
            url + path,
            json=body,
            headers={"Authorization": f"Bearer {token}"},
            ssl=client_context(ca),
        ) as answer,
    ):
        if answer.status not in (200, 201):
            raise BenchError(f"{method} {path}: HTTP {answer.status} {await answer.text()}")
        return await answer.json()


async def _replica(
    children: Children, run: Path, name: str, database: str, log_level: str
) -> tuple[str, int]:
    port = free_port()
    argv = [str(Path(sys.executable).parent / "tunnel-server"), "serve"]
    argv += ["--state-dir", str(run / name), "--listen", f"127.0.0.1:{port}"]
    argv += ["--database", database, "--ca-cert", str(run / "ca.crt")]
    argv += ["--ca-key", str(run / "ca.key"), "--replica-name", name]
    argv += ["--peer-listen", "127.0.0.1:0", "--shutdown-grace", "1s", "--log-level", log_level]
    process = await children.start(f"replica-{name}", argv)
    await wait_port(port, process, f"replica {name}")
    return f"https://127.0.0.1:{port}", port


async def _relaying(url: str, ca: bytes, token: str) -> None:
    """Wait until the replica at ``url`` relays a request (the agent is connected)."""
    async with aiohttp.ClientSession() as http:
        for _ in range(600):
            async with http.get(
                f"{url}/k8s/clusters/{CLUSTER}{POD_PATH}",
                headers={"Authorization": f"Bearer {token}"},
                ssl=client_context(ca),
            ) as answer:
                if answer.status == 200:
                    return
            await asyncio.sleep(0.1)
    raise BenchError(f"{url} did not relay a request within 60 s")


async def _run(args: argparse.Namespace, run: Path) -> dict[str, Any]:
    server = os.environ.get("TUNNEL_TEST_POSTGRES") or DEFAULT_URL
    name = f"tunnel_bench_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(server, timeout=10)
    await admin.execute(f'CREATE DATABASE "{name}"')
    database = urlsplit(server)._replace(path=f"/{name}").geturl()
    children = Children(run)
    try:
        ca = CertificateAuthority.create()
        (run / "ca.crt").write_bytes(ca.cert_pem)
        (run / "ca.key").write_bytes(ca.key_pem)
        (run / "ca.key").chmod(0o600)
        issued = ca.issue_server_certificate(["127.0.0.1"], timedelta(days=1))
        assert issued.key_pem is not None
        (run / "upstream.crt").write_bytes(issued.cert_pem)
        (run / "upstream.key").write_bytes(issued.key_pem)
        upstream = await start_upstream(children, run / "upstream.crt", run / "upstream.key")
        owner_url, _ = await _replica(children, run, "owner", database, args.log_level)
        admin_token = (run / "owner" / "admin-token").read_text().strip()
        other_url, _ = await _replica(children, run, "other", database, args.log_level)
        await _replica(children, run, "third", database, args.log_level)
        cluster = await _api(
            owner_url, ca.cert_pem, admin_token, "POST", "/api/v1/clusters", {"name": CLUSTER}
        )
        user = await _api(
            owner_url, ca.cert_pem, admin_token, "POST", "/api/v1/users", {"name": USER}
        )
        await _api(
            owner_url, ca.cert_pem, admin_token, "PUT", f"/api/v1/grants/{USER}/{CLUSTER}", {}
        )
        argv = [sys.executable, "-m", "bench.proxy_agent", "--server", owner_url]
        argv += ["--ca", str(run / "ca.crt"), "--cluster", CLUSTER]
        argv += ["--credentials-dir", str(run / "agent-credentials")]
        argv += ["--bootstrap-token", str(cluster["bootstrap_token"]), "--upstream", upstream.url]
        await children.start("agent", argv)
        token = str(user["token"])
        await _relaying(owner_url, ca.cert_pem, token)
        await _relaying(other_url, ca.cert_pem, token)
        script = write_wrk_script(run)
        headers = (("Authorization", f"Bearer {token}"),)
        targets = {
            "owner-direct": Target("owner-direct", f"{owner_url}/k8s/clusters/{CLUSTER}", headers),
            "forwarded": Target("forwarded", f"{other_url}/k8s/clusters/{CLUSTER}", headers),
        }
        results: dict[str, dict[int, list[WrkResult]]] = {key: {1: [], 64: []} for key in targets}
        for pair in range(args.pairs):
            order = list(targets) if pair % 2 == 0 else list(reversed(targets))
            for connections in (1, 64):
                for key in order:
                    results[key][connections].append(
                        await wrk(
                            children,
                            script,
                            targets[key],
                            POD_PATH,
                            connections=connections,
                            seconds=args.seconds,
                            label=f"{key}-c{connections}-{pair}",
                        )
                    )
        return _report(results)
    finally:
        await children.stop_all()
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


def _report(results: dict[str, dict[int, list[WrkResult]]]) -> dict[str, Any]:
    def median(key: str, connections: int, field: str) -> float:
        return float(statistics.median(getattr(r, field) for r in results[key][connections]))

    direct_p50 = median("owner-direct", 1, "p50")
    forwarded_p50 = median("forwarded", 1, "p50")
    direct_rate = median("owner-direct", 64, "rate")
    forwarded_rate = median("forwarded", 64, "rate")
    return {
        "c1_p50_us": {"owner_direct": direct_p50, "forwarded": forwarded_p50},
        "c1_p50_added_ms": round((forwarded_p50 - direct_p50) / 1000, 3),
        "c1_p99_us": {
            "owner_direct": median("owner-direct", 1, "p99"),
            "forwarded": median("forwarded", 1, "p99"),
        },
        "c64_requests_per_s": {
            "owner_direct": round(direct_rate),
            "forwarded": round(forwarded_rate),
        },
        "c64_forwarded_ratio": round(forwarded_rate / direct_rate, 3),
        "c64_p99_us": {
            "owner_direct": median("owner-direct", 64, "p99"),
            "forwarded": median("forwarded", 64, "p99"),
        },
        "pairs": len(results["owner-direct"][1]),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.bench_replicas", description=__doc__)
    parser.add_argument("--pairs", type=int, default=3, help="alternating pairs of windows")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds of each window")
    parser.add_argument("--quick", action="store_true", help="one pair of 3 s windows")
    parser.add_argument("--log-level", default="warning", help="the servers' log level")
    args = parser.parse_args(argv)
    if args.quick:
        args.pairs, args.seconds = 1, 3.0
    try:
        ensure_tools(install=True, ssh=False)
    except BenchError as exc:
        print(f"bench_replicas: {exc}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="bench-replicas-") as directory:
        try:
            report = asyncio.run(_run(args, Path(directory)))
        except BenchError as exc:
            print(f"bench_replicas: {exc}", file=sys.stderr)
            return 1
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
