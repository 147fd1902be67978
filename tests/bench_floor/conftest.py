"""Fixtures of the floor relays' process tests: each runs against both floors.

``bench.relay_floor`` (the cheapest Python relay) and ``bench.mux_floor`` (the
same over the product's multiplexing layer) take the same command line and
must behave alike toward their clients and the upstream.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest

from bench.procs import Children
from tunnel_pki import CertificateAuthority

from .floors import Certificates, Relay, Upstream, UpstreamConnection, said

FLOORS = ["bench.relay_floor", "bench.mux_floor"]


@pytest.fixture
def certificates(tmp_path: Path) -> Certificates:
    """A throwaway CA and a server certificate for 127.0.0.1 that it signed."""
    authority = CertificateAuthority.create()
    issued = authority.issue_server_certificate(["127.0.0.1"], timedelta(days=1))
    assert issued.key_pem is not None
    files = Certificates(tmp_path / "server.crt", tmp_path / "server.key", tmp_path / "ca.crt")
    files.cert.write_bytes(issued.cert_pem)
    files.key.write_bytes(issued.key_pem)
    files.ca.write_bytes(authority.cert_pem)
    return files


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    loop = asyncio.get_running_loop()
    connections: asyncio.Queue[UpstreamConnection] = asyncio.Queue()

    def made() -> UpstreamConnection:
        connection = UpstreamConnection()
        connections.put_nowait(connection)
        return connection

    server = await loop.create_server(made, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield Upstream(port, connections)
    finally:
        server.close()


@pytest.fixture(params=FLOORS)
async def relay(
    request: pytest.FixtureRequest, tmp_path: Path, certificates: Certificates, upstream: Upstream
) -> AsyncIterator[Relay]:
    """Near listening on free ports, far connected to it and aimed at the upstream."""
    children = Children(tmp_path)
    module = [sys.executable, "-m", request.param]
    pem = ["--cert", str(certificates.cert), "--key", str(certificates.key)]
    try:
        near = await children.start(
            "near",
            [*module, "near", "--listen", "127.0.0.1:0", "--tunnel-listen", "127.0.0.1:0", *pem],
            stdout=True,
        )
        ports = await said(near)
        tunnel, target = f"127.0.0.1:{ports['tunnel']}", f"127.0.0.1:{upstream.port}"
        far = await children.start(
            "far",
            [
                *module,
                "far",
                "--tunnel",
                tunnel,
                "--ca",
                str(certificates.ca),
                "--upstream",
                target,
            ],
        )
        assert await said(near) == {"tunnel": "connected"}
        yield Relay(children, near, far, ports["listening"], certificates.ca)
    finally:
        await children.stop_all()
