"""bench.mux_floor: near and far as processes, over the product's mux stack on real TLS.

As for :mod:`bench.relay_floor` (whose helpers these tests share), near and
far run as the benchmark runs them, on loopback; the upstream lives in the
test's event loop, so the test sees what arrives there and when its
connections close. Waiting is on what the processes say (near's JSON lines),
on reads and on events, each with a time limit; never on a sleep.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest

from bench.procs import Children
from tests.bench_floor.test_relay_floor import (
    BIG,
    PATIENCE,
    Certificates,
    Relay,
    Upstream,
    UpstreamConnection,
    answer,
    head,
    request,
    said,
)
from tunnel_pki import CertificateAuthority

pytestmark = pytest.mark.timeout(30)


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
    """A plain TCP server that answers as UpstreamConnection says; its connections queued."""
    loop = asyncio.get_running_loop()
    connections: asyncio.Queue[UpstreamConnection] = asyncio.Queue()

    def made() -> UpstreamConnection:
        connection = UpstreamConnection()
        connections.put_nowait(connection)
        return connection

    server = await loop.create_server(made, "127.0.0.1", 0)
    try:
        yield Upstream(server.sockets[0].getsockname()[1], connections)
    finally:
        server.close()


@pytest.fixture
async def relay(
    tmp_path: Path, certificates: Certificates, upstream: Upstream
) -> AsyncIterator[Relay]:
    """Near listening on free ports, far's session up with it and aimed at the upstream."""
    children = Children(tmp_path)
    module = [sys.executable, "-m", "bench.mux_floor"]
    pem = ["--cert", str(certificates.cert), "--key", str(certificates.key)]
    try:
        near = await children.start(
            "near",
            [*module, "near", "--listen", "127.0.0.1:0", "--tunnel-listen", "127.0.0.1:0", *pem],
            stdout=True,
        )
        ports = await said(near)
        far = await children.start(
            "far",
            [
                *module,
                "far",
                "--tunnel",
                f"127.0.0.1:{ports['tunnel']}",
                "--ca",
                str(certificates.ca),
                "--upstream",
                f"127.0.0.1:{upstream.port}",
            ],
        )
        assert await said(near) == {"tunnel": "connected"}
        yield Relay(children, near, far, ports["listening"], certificates.ca)
    finally:
        await children.stop_all()


async def test_a_get_reaches_the_upstream_and_its_answer_comes_back_byte_for_byte(
    relay: Relay, upstream: Upstream
) -> None:
    reader, writer = await relay.connect()
    sent = request("/pod", "Accept: application/json")
    writer.write(sent)
    connection = await upstream.next_connection()
    expected = answer(b"/pod")
    assert await asyncio.wait_for(reader.readexactly(len(expected)), PATIENCE) == expected
    assert bytes(connection.received) == sent
    writer.close()


async def test_two_client_connections_are_two_streams_with_their_own_answers(
    relay: Relay, upstream: Upstream
) -> None:
    (reader_a, writer_a), (reader_b, writer_b) = await asyncio.gather(
        relay.connect(), relay.connect()
    )
    writer_a.write(request("/a"))
    writer_b.write(request("/b"))
    first, second = await upstream.next_connection(), await upstream.next_connection()
    assert first is not second
    got_b = await asyncio.wait_for(reader_b.readexactly(len(answer(b"/b"))), PATIENCE)
    got_a = await asyncio.wait_for(reader_a.readexactly(len(answer(b"/a"))), PATIENCE)
    assert (got_a, got_b) == (answer(b"/a"), answer(b"/b"))
    assert {bytes(first.received), bytes(second.received)} == {request("/a"), request("/b")}
    writer_a.close()
    writer_b.close()


async def test_a_4_mib_answer_arrives_whole_and_in_order(relay: Relay, upstream: Upstream) -> None:
    """Four times a stream's initial credit: it arrives only if credit comes back as read."""
    reader, writer = await relay.connect()
    writer.write(request("/big"))
    got_head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), PATIENCE)
    assert got_head == head(len(BIG))
    body = await asyncio.wait_for(reader.readexactly(len(BIG)), PATIENCE)
    assert body == BIG
    writer.close()


async def test_closing_the_client_closes_its_upstream_connection(
    relay: Relay, upstream: Upstream
) -> None:
    reader, writer = await relay.connect()
    writer.write(request("/pod"))
    connection = await upstream.next_connection()
    await asyncio.wait_for(reader.readexactly(len(answer(b"/pod"))), PATIENCE)
    assert not connection.closed.is_set()
    writer.close()
    await asyncio.wait_for(connection.closed.wait(), PATIENCE)


async def test_the_upstream_closing_ends_the_client_after_its_answer(
    relay: Relay, upstream: Upstream
) -> None:
    reader, writer = await relay.connect()
    writer.write(request("/last"))
    everything = await asyncio.wait_for(reader.read(), PATIENCE)  # to end of file
    assert everything == answer(b"/last", "Connection: close")
    writer.close()


async def test_the_far_end_exits_when_the_near_end_stops_and_both_exit_cleanly(
    relay: Relay,
) -> None:
    await relay.children.stop(relay.near)
    assert relay.near.returncode == 0
    assert await asyncio.wait_for(relay.far.wait(), PATIENCE) == 1
