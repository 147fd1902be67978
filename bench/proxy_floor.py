"""What aiohttp alone costs per request here: the floor under the tunnel's server and agent.

The tunnel server answers kubectl with aiohttp's web server over TLS, and the
agent calls the API server with aiohttp's client; whatever else they do comes
on top. This measures the two with nothing on top, on the same machine and
with the same clients as :mod:`bench.bench_proxy`:

- ``server``: an aiohttp web server over TLS (the tunnel server's certificate
  type) whose handler streams the same ~500-byte Pod the way the kube proxy
  does (``StreamResponse``: prepare, write, write_eof), under ``wrk -c64``;
  CPU per request of that process;
- ``client``: 64 concurrent aiohttp ``ClientSession`` GETs with the agent's
  session settings and request headers against the benchmark's upstream,
  for 5 s; CPU per request of the client process.

    .venv/bin/python -m bench.proxy_floor
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import ssl
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from ipaddress import ip_address
from pathlib import Path

import aiohttp
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from .procs import BenchError, Children, cpu_seconds, free_port, wait_port
from .proxy_load import Target, write_wrk_script, wrk
from .proxy_upstream import POD, POD_PATH

__all__ = ["main"]

_HEADERS = {
    "accept": "application/json",
    "authorization": "Bearer bench-agent-service-account-token",
    "impersonate-user": "tunnel:bench",
    "impersonate-group": "tunnel:bench",
}


def _self_signed(directory: Path) -> tuple[Path, Path]:
    """A P-256 certificate for 127.0.0.1, as the tunnel server's own is."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.now(UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=1))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ip_address("127.0.0.1"))]), False
        )
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "floor.crt", directory / "floor.key"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


async def _pod(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"content-type": "application/json", "content-length": str(len(POD))}
    )
    await response.prepare(request)
    await response.write(POD)
    await response.write_eof()
    return response


async def serve(port: int, cert: str, key: str) -> None:
    """The floor server: until SIGTERM."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    context.set_alpn_protocols(["http/1.1"])
    app = web.Application()
    app.router.add_get(POD_PATH, _pod)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=context, backlog=1024).start()
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


async def client_floor(url: str, seconds: float) -> tuple[float, float]:
    """Requests/s and CPU microseconds per request of 64 concurrent aiohttp GETs."""
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
        auto_decompress=False,
        skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept"),
    )
    count = 0
    stop = time.monotonic() + seconds

    async def worker() -> None:
        nonlocal count
        while time.monotonic() < stop:
            async with session.get(url, headers=_HEADERS, allow_redirects=False) as response:
                async for _ in response.content.iter_any():
                    pass
            count += 1

    async with session:
        cpu, started = time.process_time(), time.monotonic()
        await asyncio.gather(*(worker() for _ in range(64)))
        cpu, elapsed = time.process_time() - cpu, time.monotonic() - started
    return count / elapsed, cpu * 1e6 / max(count, 1)


async def _run(seconds: int) -> None:
    run_dir = Path(tempfile.mkdtemp(prefix="bench-proxy-floor-"))
    children = Children(run_dir)
    try:
        cert, key = _self_signed(run_dir)
        port = free_port()
        upstream_port = free_port()
        upstream = await children.start(
            "upstream", [sys.executable, "-m", "bench.proxy_upstream", "--port", str(upstream_port)]
        )
        await wait_port(upstream_port, upstream, "the upstream")
        argv = [sys.executable, "-m", "bench.proxy_floor", "--serve", str(port)]
        server = await children.start(
            "floor-server", [*argv, "--cert", str(cert), "--key", str(key)]
        )
        await wait_port(port, server, "the floor server")
        script = write_wrk_script(run_dir)
        target = Target("aiohttp-server", f"https://127.0.0.1:{port}")
        await wrk(children, script, target, POD_PATH, connections=64, seconds=2, label="warm")
        before = sum(cpu_seconds(server.pid))
        result = await wrk(
            children, script, target, POD_PATH, connections=64, seconds=seconds, label="floor"
        )
        server_us = (sum(cpu_seconds(server.pid)) - before) * 1e6 / result.requests
        print(
            f"aiohttp web server over TLS, StreamResponse, wrk -c64: {result.rate:,.0f} "
            f"requests/s, {server_us:.0f} us CPU per request in the server"
        )
        rate, client_us = await client_floor(f"http://127.0.0.1:{upstream_port}{POD_PATH}", seconds)
        print(
            f"aiohttp ClientSession, 64 concurrent GETs to the upstream: {rate:,.0f} "
            f"requests/s, {client_us:.0f} us CPU per request in the client"
        )
    finally:
        await children.stop_all()
        shutil.rmtree(run_dir, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.proxy_floor", description=__doc__)
    parser.add_argument("--seconds", type=int, default=5, help="length of each measurement")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cert", help=argparse.SUPPRESS)
    parser.add_argument("--key", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        if args.serve:
            asyncio.run(serve(args.serve, args.cert, args.key))
        else:
            asyncio.run(_run(args.seconds))
    except BenchError as exc:
        print(f"proxy_floor: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
