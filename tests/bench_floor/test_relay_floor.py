"""bench.relay_floor: its framing and backpressure alone, then near and far as processes.

The first tests drive one tunnel end (:class:`bench.relay_floor.Mux`) with
stand-in transports: how frames split anywhere are parsed, how a turn's
frames leave in one write, and who stops reading when a buffer is full (on
loopback the kernel's socket buffers absorb megabytes, so a real transfer
does not reliably reach those states). The others run near and far as the
benchmark does, over real TLS on loopback; the upstream lives in the test's
event loop, so the test sees what arrives there and when its connections
close. Waiting is on what the processes say (near's JSON lines), on reads and
on events, each with a time limit; never on a sleep.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import pytest

from bench.procs import Children
from bench.relay_floor import CLOSE, DATA, HEADER, OPEN, Mux, Stream
from tests.support import until
from tunnel_pki import CertificateAuthority

pytestmark = pytest.mark.timeout(30)

MIB = 1024 * 1024
#: Patience for one step (a read, a close, a process saying something).
PATIENCE = 10.0
#: The large response: random, so that a lost, doubled or reordered piece shows.
BIG = os.urandom(4 * MIB)
_CHUNK = 64 * 1024


def request(path: str, *extra: str) -> bytes:
    lines = [f"GET {path} HTTP/1.1", "Host: 127.0.0.1", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def head(length: int, *extra: str) -> bytes:
    lines = ["HTTP/1.1 200 OK", f"Content-Length: {length}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def answer(body: bytes, *extra: str) -> bytes:
    return head(len(body), *extra) + body


class FakeTransport:
    """Stands in for a transport: keeps what is written, and whether it reads."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.reading = True
        self.closed = False
        self.aborted = False

    def write(self, data: bytes | memoryview) -> None:
        self.writes.append(bytes(data))

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    @property
    def written(self) -> bytes:
        return b"".join(self.writes)


def frame(kind: int, sid: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, sid, len(payload)) + payload


def tunnel_end() -> tuple[Mux, FakeTransport]:
    """A near end of the tunnel (it opens streams, it does not accept them), connected."""
    mux, transport = Mux(), FakeTransport()
    mux.connection_made(cast(asyncio.Transport, transport))
    return mux, transport


def stream_of(mux: Mux, sid: int) -> tuple[Stream, FakeTransport]:
    stream, transport = Stream(mux, sid), FakeTransport()
    stream.connection_made(cast(asyncio.Transport, transport))
    return stream, transport


@pytest.mark.parametrize("piece", [1, 2, 8, 9, 10, 4096])
async def test_frames_split_anywhere_reach_their_streams_whole(piece: int) -> None:
    mux, _ = tunnel_end()
    _, first = stream_of(mux, 1)
    _, second = stream_of(mux, 2)
    wire = (
        frame(DATA, 1, b"hello ")
        + frame(DATA, 2, bytes(range(256)) * 4)
        + frame(DATA, 7, b"for a stream closed here: dropped")
        + frame(DATA, 1, b"")
        + frame(DATA, 1, b"world")
        + frame(CLOSE, 2)
    )
    for start in range(0, len(wire), piece):
        mux.data_received(wire[start : start + piece])
    assert first.written == b"hello world"
    assert second.written == bytes(range(256)) * 4
    assert (first.closed, second.closed) == (False, True)
    assert set(mux.streams) == {1}


async def test_a_stream_gone_mid_frame_gets_no_more_and_tells_the_other_end() -> None:
    mux, tunnel = tunnel_end()
    first, first_socket = stream_of(mux, 1)
    _, second_socket = stream_of(mux, 2)
    wire = frame(DATA, 1, b"a" * 100) + frame(DATA, 2, b"for the other stream")
    mux.data_received(wire[:50])
    first_socket.close()
    mux.data_received(wire[50:80])  # its socket is closing: nothing more is written to it
    first.connection_lost(None)
    mux.data_received(wire[80:])
    assert first_socket.written == b"a" * 41
    assert second_socket.written == b"for the other stream"
    await until(lambda: bool(tunnel.writes))
    assert tunnel.written.endswith(frame(CLOSE, 1))


async def test_a_turns_frames_leave_in_one_write() -> None:
    mux, tunnel = tunnel_end()
    stream, _ = stream_of(mux, 1)
    stream.data_received(b"GET / HTTP/1.1\r\n\r\n")
    stream.data_received(b"more")
    assert tunnel.writes == []
    await until(lambda: bool(tunnel.writes))
    assert tunnel.writes == [
        frame(OPEN, 1) + frame(DATA, 1, b"GET / HTTP/1.1\r\n\r\n") + frame(DATA, 1, b"more")
    ]


async def test_a_full_tunnel_stops_every_stream_reading_until_it_drains() -> None:
    mux, _ = tunnel_end()
    _, first = stream_of(mux, 1)
    mux.pause_writing()
    _, second = stream_of(mux, 2)  # connected while the tunnel is full: starts paused
    assert (first.reading, second.reading) == (False, False)
    mux.resume_writing()
    assert (first.reading, second.reading) == (True, True)


async def test_a_full_stream_stops_the_tunnel_reading_until_no_stream_is_full() -> None:
    mux, tunnel = tunnel_end()
    first, _ = stream_of(mux, 1)
    second, _ = stream_of(mux, 2)
    first.pause_writing()
    second.pause_writing()
    first.resume_writing()
    assert not tunnel.reading
    second.connection_lost(None)  # gone while full: no longer holds the tunnel
    assert tunnel.reading


async def test_a_frame_outside_the_protocol_closes_the_tunnel() -> None:
    mux, tunnel = tunnel_end()
    mux.data_received(frame(9, 1, b"?"))
    assert tunnel.aborted


@dataclass
class Certificates:
    cert: Path
    key: Path
    ca: Path


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


class UpstreamConnection(asyncio.Protocol):
    """One connection the relay made to the upstream.

    It answers each request with its path as the body, ``/big`` with
    :data:`BIG` (written as a server does: while the socket takes it), and
    ``/last`` with the path and ``Connection: close``, closing after.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.received = bytearray()
        self._unanswered = 0
        self.closed = asyncio.Event()
        self._paused = False
        self._big_left = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.received += data
        while (end := self.received.find(b"\r\n\r\n", self._unanswered)) >= 0:
            path = bytes(self.received[self._unanswered : end]).split(b" ")[1]
            self._unanswered = end + 4
            if path == b"/big":
                self.transport.write(head(len(BIG)))
                self._big_left = len(BIG)
                self._pump()
            elif path == b"/last":
                self.transport.write(answer(path, "Connection: close"))
                self.transport.close()
            else:
                self.transport.write(answer(path))

    def _pump(self) -> None:
        while self._big_left and not self._paused and self.transport is not None:
            start = len(BIG) - self._big_left
            self.transport.write(BIG[start : start + _CHUNK])
            self._big_left -= min(_CHUNK, self._big_left)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._pump()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.closed.set()


@dataclass
class Upstream:
    port: int
    connections: asyncio.Queue[UpstreamConnection] = field(default_factory=asyncio.Queue)

    async def next_connection(self) -> UpstreamConnection:
        return await asyncio.wait_for(self.connections.get(), PATIENCE)


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


@dataclass
class Relay:
    children: Children
    near: asyncio.subprocess.Process
    far: asyncio.subprocess.Process
    port: int
    ca: Path

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A client connection to the near end, over TLS that trusts the test CA only."""
        context = ssl.create_default_context(cafile=str(self.ca))
        return await asyncio.wait_for(
            asyncio.open_connection(
                "127.0.0.1", self.port, ssl=context, server_hostname="127.0.0.1"
            ),
            PATIENCE,
        )


async def said(process: asyncio.subprocess.Process) -> dict[str, Any]:
    """The next JSON line ``process`` writes to stdout."""
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), PATIENCE)
    assert line, f"the process exited (status {process.returncode}); see its log"
    said: dict[str, Any] = json.loads(line)
    return said


@pytest.fixture
async def relay(
    tmp_path: Path, certificates: Certificates, upstream: Upstream
) -> AsyncIterator[Relay]:
    """Near listening on free ports, far connected to it and aimed at the upstream."""
    children = Children(tmp_path)
    module = [sys.executable, "-m", "bench.relay_floor"]
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


async def test_both_ends_exit_cleanly_on_sigterm(relay: Relay) -> None:
    await relay.children.stop(relay.far)
    await relay.children.stop(relay.near)
    assert (relay.far.returncode, relay.near.returncode) == (0, 0)


async def test_the_far_end_exits_when_the_tunnel_closes(relay: Relay) -> None:
    await relay.children.stop(relay.near)
    assert await asyncio.wait_for(relay.far.wait(), PATIENCE) == 1


async def test_a_client_leaving_mid_answer_closes_the_upstream_connection(
    relay: Relay, upstream: Upstream, tmp_path: Path
) -> None:
    reader, writer = await relay.connect()
    writer.write(request("/big"))
    connection = await upstream.next_connection()
    await asyncio.wait_for(reader.readexactly(len(head(len(BIG))) + _CHUNK), PATIENCE)
    writer.close()
    await asyncio.wait_for(connection.closed.wait(), PATIENCE)
