"""The agent's HTTP/1.1 client to the API server, against real loopback servers."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client as kube_client

from tunnel_agent.kubeapi import KubeApi
from tunnel_agent.upstream import (
    HIGH_WATER_BYTES,
    BodyReader,
    UpstreamConnectError,
    UpstreamError,
    UpstreamPool,
    UpstreamRequestError,
)
from tunnel_pki.ca import CertificateAuthority
from tunnel_pki.csr import make_csr
from tunnel_pki.keys import generate_private_key, private_key_to_pem
from tunnel_pki.tls import client_context, server_context

from ..support import until

# A loopback stand-in for the API server ------------------------------------------------


@dataclass
class Peer:
    """One connection the origin accepted."""

    number: int
    writer: asyncio.StreamWriter
    #: The client closed the connection (EOF or reset).
    client_left: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Exchange:
    """A request the origin read, and the means to answer it."""

    peer: Peer
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes
    reader: asyncio.StreamReader
    #: Set to False by an answer to close the connection after it.
    keep: bool = True

    def header(self, name: str) -> str | None:
        return next((value for key, value in self.headers if key == name), None)

    def write(self, data: bytes) -> None:
        self.peer.writer.write(data)


Answer = Callable[[Exchange], Coroutine[Any, Any, None]]


class Origin:
    """An HTTP/1.1 server whose answers each test writes byte for byte."""

    def __init__(self, answer: Answer, context: ssl.SSLContext | None = None) -> None:
        self._answer = answer
        self._context = context
        self._server: asyncio.Server | None = None
        self._serving: set[asyncio.Task[None]] = set()
        self._answering: set[asyncio.Task[None]] = set()
        self.peers: list[Peer] = []
        self.exchanges: list[Exchange] = []
        self.port = 0

    @property
    def url(self) -> str:
        return f"{'https' if self._context else 'http'}://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self._context)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        # Answers still going are stopped, and every connection cut: each
        # connection's task then ends by itself (cancelling it would make
        # asyncio's StreamReaderProtocol log an error).
        for task in self._answering:
            task.cancel()
        for peer in self.peers:
            peer.writer.transport.abort()
        await asyncio.gather(*self._serving)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._serving.add(task)
        peer = Peer(len(self.peers), writer)
        self.peers.append(peer)
        try:
            while (request := await _read_request(reader)) is not None:
                exchange = Exchange(peer, *request, reader)
                self.exchanges.append(exchange)
                answering = asyncio.create_task(self._answer(exchange))
                self._answering.add(answering)
                await asyncio.wait([answering])
                self._answering.discard(answering)
                if answering.cancelled():
                    return
                answering.result()
                await writer.drain()
                if not exchange.keep:
                    return
            peer.client_left.set()
        except (ConnectionError, asyncio.IncompleteReadError):
            peer.client_left.set()
        finally:
            self._serving.discard(task)
            writer.close()


async def _read_request(
    reader: asyncio.StreamReader,
) -> tuple[str, str, list[tuple[str, str]], bytes] | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise
        return None
    first, *lines = head[:-4].decode("utf-8").split("\r\n")
    method, target, version = first.split(" ")
    assert version == "HTTP/1.1"
    headers = []
    for line in lines:
        name, _, value = line.partition(":")
        headers.append((name.lower(), value.strip()))
    values = dict(headers)
    if "content-length" in values:
        body = await reader.readexactly(int(values["content-length"]))
    elif values.get("transfer-encoding") == "chunked":
        parts = []
        while size := int(await reader.readuntil(b"\r\n"), 16):
            parts.append(await reader.readexactly(size))
            assert await reader.readexactly(2) == b"\r\n"
        assert await reader.readuntil(b"\r\n") == b"\r\n"
        body = b"".join(parts)
    else:
        body = b""
    return method, target, headers, body


@contextlib.asynccontextmanager
async def running(answer: Answer, context: ssl.SSLContext | None = None) -> AsyncIterator[Origin]:
    origin = Origin(answer, context)
    await origin.start()
    try:
        yield origin
    finally:
        await origin.stop()


@contextlib.asynccontextmanager
async def pool_for(
    url: str,
    ssl_context: ssl.SSLContext | bool | None = None,
    *,
    max_idle: int = 32,
    connect_timeout: float = 10.0,
) -> AsyncIterator[UpstreamPool]:
    pool = UpstreamPool(url, ssl_context, max_idle=max_idle, connect_timeout=connect_timeout)
    try:
        yield pool
    finally:
        await pool.close()


def response_bytes(body: bytes, *headers: str, status: str = "200 OK") -> bytes:
    lines = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def ok(exchange: Exchange) -> None:
    """Answer with what was asked, as the body."""
    exchange.write(response_bytes(f"{exchange.method} {exchange.target}".encode()))


def body_of(*chunks: bytes) -> BodyReader:
    """A request body that comes in these chunks."""
    pending = deque(chunks)

    async def read() -> bytes:
        return pending.popleft() if pending else b""

    return read


async def read_all(pool: UpstreamPool, method: str, path: str) -> bytes:
    """The whole body of the answer to a request without a body."""
    response = await pool.request(method, path, [])
    with response:
        parts = []
        while chunk := await response.read():
            parts.append(chunk)
        return b"".join(parts)


# Connections ------------------------------------------------------------------------------


async def test_the_next_request_reuses_the_same_connection() -> None:
    async with running(ok) as origin, pool_for(origin.url) as pool:
        assert await read_all(pool, "GET", "/api/v1/pods") == b"GET /api/v1/pods"
        assert await read_all(pool, "GET", "/api/v1/nodes?limit=1") == b"GET /api/v1/nodes?limit=1"
        assert [exchange.peer.number for exchange in origin.exchanges] == [0, 0]
        assert len(origin.peers) == 1
        assert pool.idle_connections == 1


async def test_host_header_and_path_prefix_come_from_the_base_url() -> None:
    async with running(ok) as origin, pool_for(origin.url + "/k8s/clusters/x/") as pool:
        await read_all(pool, "GET", "/api/v1/pods?watch=1")
        [exchange] = origin.exchanges
        assert exchange.target == "/k8s/clusters/x/api/v1/pods?watch=1"
        assert exchange.header("host") == f"127.0.0.1:{origin.port}"


async def test_framing_headers_given_by_the_caller_are_replaced_by_the_clients_own() -> None:
    async with running(ok) as origin, pool_for(origin.url) as pool:
        response = await pool.request(
            "GET",
            "/api",
            [("host", "evil.example"), ("connection", "close"), ("x-kept", "yes")],
        )
        response.close()
        [exchange] = origin.exchanges
        assert [name for name, _ in exchange.headers].count("host") == 1
        assert exchange.header("host") == f"127.0.0.1:{origin.port}"
        assert exchange.header("connection") is None
        assert exchange.header("x-kept") == "yes"


async def test_an_answer_with_connection_close_is_not_reused() -> None:
    async def closing(exchange: Exchange) -> None:
        exchange.write(response_bytes(b"bye", "Connection: close"))
        exchange.keep = False

    async with running(closing) as origin, pool_for(origin.url) as pool:
        assert await read_all(pool, "GET", "/a") == b"bye"
        assert await read_all(pool, "GET", "/b") == b"bye"
        assert [exchange.peer.number for exchange in origin.exchanges] == [0, 1]


async def test_idle_connections_beyond_the_bound_are_closed() -> None:
    async with running(ok) as origin, pool_for(origin.url, max_idle=1) as pool:
        first = await pool.request("GET", "/a", [])
        second = await pool.request("GET", "/b", [])
        for response in (first, second):
            with response:
                assert await response.read()
                assert await response.read() == b""
        assert pool.idle_connections == 1
        # The one given back second found the pool full: the origin sees it leave.
        await origin.peers[1].client_left.wait()
        assert not origin.peers[0].client_left.is_set()


async def test_a_connection_the_server_closed_while_idle_is_not_used() -> None:
    async with running(ok) as origin, pool_for(origin.url) as pool:
        await read_all(pool, "GET", "/a")
        origin.peers[0].writer.close()
        await until(lambda: pool.open_connections == 0)
        assert pool.idle_connections == 0
        assert await read_all(pool, "GET", "/b") == b"GET /b"
        assert [exchange.peer.number for exchange in origin.exchanges] == [0, 1]


async def test_a_stale_pooled_connection_is_retried_once_on_a_fresh_one() -> None:
    """The server closes a kept connection as the next request arrives: no byte answered."""

    async def close_kept_ones(exchange: Exchange) -> None:
        if exchange.peer.number == 0 and len(origin.exchanges) == 2:
            exchange.keep = False
            return
        await ok(exchange)

    async with running(close_kept_ones) as origin, pool_for(origin.url) as pool:
        assert await read_all(pool, "GET", "/a") == b"GET /a"
        assert await read_all(pool, "GET", "/b") == b"GET /b"
        assert [(e.peer.number, e.target) for e in origin.exchanges] == [
            (0, "/a"),
            (0, "/b"),
            (1, "/b"),
        ]


async def test_a_request_is_retried_once_only() -> None:
    async def answer_first_only(exchange: Exchange) -> None:
        if len(origin.exchanges) == 1:
            await ok(exchange)
        else:
            exchange.keep = False

    async with running(answer_first_only) as origin, pool_for(origin.url) as pool:
        await read_all(pool, "GET", "/a")
        with pytest.raises(UpstreamError, match="closed the connection without answering"):
            await pool.request("GET", "/b", [])
        assert [(e.peer.number, e.target) for e in origin.exchanges] == [
            (0, "/a"),
            (0, "/b"),
            (1, "/b"),
        ]


async def test_a_stale_connection_is_not_retried_once_body_bytes_were_read() -> None:
    async def answer_first_only(exchange: Exchange) -> None:
        if len(origin.exchanges) == 1:
            await ok(exchange)
        else:
            exchange.keep = False

    async with running(answer_first_only) as origin, pool_for(origin.url) as pool:
        await read_all(pool, "GET", "/a")
        with pytest.raises(UpstreamError, match="without answering"):
            await pool.request("POST", "/b", [("content-length", "4")], body_of(b"data"))
        assert [(e.peer.number, e.target, e.body) for e in origin.exchanges] == [
            (0, "/a", b""),
            (0, "/b", b"data"),
        ]


@pytest.mark.parametrize("method", ["POST", "DELETE", "PATCH"])
async def test_a_stale_connection_is_not_retried_for_a_request_that_is_not_idempotent(
    method: str,
) -> None:
    """Without a body the API server may have acted on it before it closed."""

    async def answer_first_only(exchange: Exchange) -> None:
        if len(origin.exchanges) == 1:
            await ok(exchange)
        else:
            exchange.keep = False

    async with running(answer_first_only) as origin, pool_for(origin.url) as pool:
        await read_all(pool, "GET", "/a")
        with pytest.raises(UpstreamError, match="without answering"):
            await pool.request(method, "/b", [])
        assert [(e.peer.number, e.target) for e in origin.exchanges] == [(0, "/a"), (0, "/b")]


async def test_a_stale_connection_is_not_retried_once_an_empty_chunked_body_was_ended() -> None:
    async def answer_first_only(exchange: Exchange) -> None:
        if len(origin.exchanges) == 1:
            await ok(exchange)
        else:
            exchange.keep = False

    async with running(answer_first_only) as origin, pool_for(origin.url) as pool:
        await read_all(pool, "GET", "/a")
        with pytest.raises(UpstreamError, match="without answering"):
            await pool.request("POST", "/b", [], body_of())
        assert [(e.peer.number, e.target) for e in origin.exchanges] == [(0, "/a"), (0, "/b")]


async def test_a_reason_phrase_split_across_reads_is_kept_whole() -> None:
    async def split_status_line(exchange: Exchange) -> None:
        exchange.write(b"HTTP/1.1 200 Al")
        await exchange.peer.writer.drain()
        await until(lambda: pool.open_connections == 1 and first_part_read(), max_turns=10**6)
        exchange.write(b"l Good\r\nContent-Length: 0\r\n\r\n")

    def first_part_read() -> bool:
        return any(c.received for c in pool._open)  # the first piece reached the parser

    async with running(split_status_line) as origin, pool_for(origin.url) as pool:
        response = await pool.request("GET", "/a", [])
        with response:
            assert (response.status, response.reason) == (200, "All Good")
        assert len(origin.exchanges) == 1


async def test_pool_close_closes_idle_connections_and_refuses_new_requests() -> None:
    async with running(ok) as origin:
        pool = UpstreamPool(origin.url)
        await read_all(pool, "GET", "/a")
        await pool.close()
        await origin.peers[0].client_left.wait()
        assert pool.open_connections == 0
        with pytest.raises(UpstreamError, match="stopping"):
            await pool.request("GET", "/b", [])


# Response bodies --------------------------------------------------------------------------


async def test_content_length_body_is_read_whole() -> None:
    body = bytes(range(256)) * 1000

    async def big(exchange: Exchange) -> None:
        exchange.write(response_bytes(body, "Content-Type: application/octet-stream"))

    async with running(big) as origin, pool_for(origin.url) as pool:
        response = await pool.request("GET", "/blob", [])
        with response:
            assert (response.status, response.reason) == (200, "OK")
            assert ("content-type", "application/octet-stream") in response.headers
            parts = []
            while chunk := await response.read():
                parts.append(chunk)
        assert b"".join(parts) == body
        assert pool.idle_connections == 1


async def test_chunked_body_arrives_chunk_by_chunk() -> None:
    lines: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def watch(exchange: Exchange) -> None:
        exchange.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        while (line := await lines.get()) is not None:
            exchange.write(b"%x\r\n%s\r\n" % (len(line), line))
        exchange.write(b"0\r\n\r\n")

    async with running(watch) as origin, pool_for(origin.url) as pool:
        response = await pool.request("GET", "/api/v1/pods?watch=1", [])
        with response:
            assert ("transfer-encoding", "chunked") in response.headers
            for number in range(3):
                line = b'{"type":"ADDED","n":%d}\n' % number
                await lines.put(line)
                # Each event is handed out before the next exists: nothing waits for the end.
                assert await response.read() == line
            await lines.put(None)
            assert await response.read() == b""
        assert pool.idle_connections == 1


async def test_close_delimited_body_ends_with_the_connection_and_is_not_reused() -> None:
    async def until_close(exchange: Exchange) -> None:
        exchange.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it, ")
        exchange.write(b"until the end")
        exchange.keep = False

    async with running(until_close) as origin, pool_for(origin.url) as pool:
        assert await read_all(pool, "GET", "/a") == b"all of it, until the end"
        assert pool.idle_connections == 0
        assert await read_all(pool, "GET", "/b") == b"all of it, until the end"
        assert [exchange.peer.number for exchange in origin.exchanges] == [0, 1]


async def test_an_answer_cut_short_raises_and_is_not_reused() -> None:
    async def cut(exchange: Exchange) -> None:
        exchange.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")
        exchange.keep = False

    async with running(cut) as origin, pool_for(origin.url) as pool:
        response = await pool.request("GET", "/a", [])
        with response:
            assert await response.read() == b"only this"
            with pytest.raises(UpstreamError, match="before the end of its answer"):
                await response.read()
        assert pool.open_connections == 0


async def test_interim_100_continue_is_skipped() -> None:
    async def with_continue(exchange: Exchange) -> None:
        exchange.write(
            b"HTTP/1.1 100 Continue\r\n\r\n" + response_bytes(b"created", status="201 Created")
        )

    async with running(with_continue) as origin, pool_for(origin.url) as pool:
        response = await pool.request("POST", "/a", [("content-length", "2")], body_of(b"{}"))
        with response:
            assert (response.status, response.reason) == (201, "Created")
            assert await response.read() == b"created"


async def test_reading_pauses_while_the_relay_does_not_read_and_resumes_when_it_does() -> None:
    size = 64 * 1024 * 1024
    piece = bytes(range(256)) * 256  # 64 KiB
    written = 0

    async def bulk(exchange: Exchange) -> None:
        nonlocal written
        exchange.write(f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n".encode())
        while written < size:
            exchange.write(piece)
            written += len(piece)
            await exchange.peer.writer.drain()

    async with running(bulk) as origin, pool_for(origin.url) as pool:
        response = await pool.request("GET", "/logs", [])
        with response:
            await until(lambda: response.reading_paused)
            # The socket buffers fill; then the origin's own buffer passes its
            # high-water mark (64 KiB), where its drain() blocks.
            server = origin.peers[0].writer.transport
            await until(lambda: server.get_write_buffer_size() > 64 * 1024)
            assert written < size
            paused_while_blocked = response.reading_paused
            assert paused_while_blocked
            # What waits in the agent stays bounded: the bound and at most one socket read.
            assert response.buffered <= HIGH_WATER_BYTES + 256 * 1024
            received = 0
            while chunk := await response.read():
                assert _matches(chunk, piece, received)
                received += len(chunk)
            assert received == size
            assert not response.reading_paused
        assert pool.idle_connections == 1
        assert len(origin.exchanges) == 1


def _matches(chunk: bytes, piece: bytes, offset: int) -> bool:
    """``chunk`` is what an endless repetition of ``piece`` holds at ``offset``."""
    start = offset % len(piece)
    repeated = piece[start:] + piece * (len(chunk) // len(piece) + 1)
    return chunk == repeated[: len(chunk)]


async def test_cancelling_the_reader_closes_the_connection_at_once() -> None:
    """A caller that leaves a watch ends it at the API server: no wait for its next event."""
    first_sent = asyncio.Event()

    async def endless_watch(exchange: Exchange) -> None:
        exchange.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        first_sent.set()
        # Quiet, as a watch with no events is: only the client's leaving ends it.
        assert await exchange.reader.read(1) == b""
        exchange.peer.client_left.set()
        exchange.keep = False

    async def relay(pool: UpstreamPool, got_first: asyncio.Event) -> None:
        response = await pool.request("GET", "/api/v1/pods?watch=1", [])
        with response:
            assert await response.read() == b"first"
            got_first.set()
            await response.read()
            raise AssertionError("the watch never ends by itself")

    async with running(endless_watch) as origin, pool_for(origin.url) as pool:
        got_first = asyncio.Event()
        task = asyncio.create_task(relay(pool, got_first))
        await got_first.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await origin.peers[0].client_left.wait()
        assert pool.open_connections == 0
        assert pool.idle_connections == 0


async def test_a_response_left_before_its_end_closes_the_connection() -> None:
    async def big(exchange: Exchange) -> None:
        exchange.write(response_bytes(b"x" * 1_000_000))

    async with running(big) as origin, pool_for(origin.url) as pool:
        response = await pool.request("GET", "/a", [])
        with response:
            assert await response.read()
        await origin.peers[0].client_left.wait()
        assert pool.idle_connections == 0


# Request bodies ---------------------------------------------------------------------------


async def echo(exchange: Exchange) -> None:
    exchange.write(response_bytes(b"%d bytes" % len(exchange.body)))


async def test_body_with_content_length_arrives_intact() -> None:
    chunks = [bytes([n]) * 70_000 for n in range(20)]
    total = sum(map(len, chunks))
    async with running(echo) as origin, pool_for(origin.url) as pool:
        response = await pool.request(
            "PUT", "/a", [("content-length", str(total))], body_of(*chunks)
        )
        with response:
            assert await response.read() == b"%d bytes" % total
        [exchange] = origin.exchanges
        assert exchange.body == b"".join(chunks)
        assert exchange.header("content-length") == str(total)
        assert exchange.header("transfer-encoding") is None
        assert pool.idle_connections == 1


async def test_body_without_length_is_sent_chunked_and_arrives_intact() -> None:
    chunks = [b"first,", b"second," * 10_000, b"third"]
    async with running(echo) as origin, pool_for(origin.url) as pool:
        response = await pool.request("POST", "/a", [], body_of(*chunks))
        with response:
            assert await response.read() == b"%d bytes" % len(b"".join(chunks))
        [exchange] = origin.exchanges
        assert exchange.header("transfer-encoding") == "chunked"
        assert exchange.body == b"".join(chunks)
        assert pool.idle_connections == 1


async def test_body_shorter_than_its_content_length_fails_and_closes_the_connection() -> None:
    async with running(echo) as origin, pool_for(origin.url) as pool:
        with pytest.raises(UpstreamRequestError, match="ended after 5 of its 10 bytes"):
            await pool.request("POST", "/a", [("content-length", "10")], body_of(b"short"))
        await until(lambda: bool(origin.peers) and origin.peers[0].client_left.is_set())
        assert origin.exchanges == []
        assert pool.open_connections == 0


async def test_body_longer_than_its_content_length_is_refused() -> None:
    async def wait_for_more(exchange: Exchange) -> None:
        # The origin has its 4 bytes (if the client's abort let them through);
        # it answers only once the client is gone.
        if not await exchange.reader.read(1):
            exchange.peer.client_left.set()
        exchange.keep = False

    async with running(wait_for_more) as origin, pool_for(origin.url) as pool:
        with pytest.raises(UpstreamRequestError, match="longer than its content-length"):
            await pool.request("POST", "/a", [("content-length", "4")], body_of(b"data", b"more"))
        await until(lambda: bool(origin.peers) and origin.peers[0].client_left.is_set())
        assert all(exchange.body == b"data" for exchange in origin.exchanges)
        assert pool.open_connections == 0


async def test_a_length_without_a_body_is_refused_before_sending() -> None:
    async with running(echo) as origin, pool_for(origin.url) as pool:
        with pytest.raises(UpstreamRequestError, match="carries none"):
            await pool.request("POST", "/a", [("content-length", "3")])
        assert origin.peers == []


# Refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "headers", "match"),
    [
        ("GET", "/a", [("x-note", "one\r\nimpersonate-user: system:admin")], "x-note header"),
        ("GET", "/a", [("x-note", "one\nx: y")], "control character"),
        ("GET", "/a", [("x-note", "nul\x00")], "control character"),
        ("GET", "/a", [("x-evil\r\nx", "v")], "header name"),
        ("GET", "/a", [("x evil", "v")], "header name"),
        ("GET", "/a HTTP/1.1\r\nx: y", [], "path"),
        ("GET", "/a\tb", [], "path"),
        ("GET", "/a\x85", [], "path"),
        ("GET /x", "/a", [], "method"),
        ("GET", "/a", [("content-length", "1e3")], "content-length"),
        ("GET", "/a", [("content-length", "1"), ("content-length", "1")], "content-length"),
    ],
)
async def test_unsafe_requests_are_refused_before_anything_is_sent(
    method: str, path: str, headers: list[tuple[str, str]], match: str
) -> None:
    async with running(ok) as origin, pool_for(origin.url) as pool:
        with pytest.raises(UpstreamRequestError, match=match) as raised:
            await pool.request(method, path, headers, body_of(b"x"))
        assert "system:admin" not in str(raised.value)
        assert origin.peers == []


async def test_values_never_appear_in_errors() -> None:
    async with running(ok) as origin, pool_for(origin.url) as pool:
        with pytest.raises(UpstreamRequestError) as raised:
            await pool.request("GET", "/a", [("authorization", "Bearer secret-token\r\n")])
        assert "secret-token" not in str(raised.value)
        assert "authorization" in str(raised.value)
        assert origin.peers == []


async def test_head_requests_are_not_for_this_client() -> None:
    async with running(ok) as origin, pool_for(origin.url) as pool:
        with pytest.raises(ValueError, match="HEAD"):
            await pool.request("HEAD", "/a", [])
        assert origin.peers == []


async def test_an_oversize_response_head_is_refused() -> None:
    async def huge_head(exchange: Exchange) -> None:
        headers = [f"X-Filler-{n}: {'v' * 10_000}" for n in range(4)]
        exchange.write(response_bytes(b"body", *headers))

    async with running(huge_head) as origin, pool_for(origin.url) as pool:
        with pytest.raises(UpstreamError, match="head is over"):
            await pool.request("GET", "/a", [])
        assert pool.open_connections == 0


async def test_an_endless_response_head_is_refused_before_it_ends() -> None:
    async def endless_head(exchange: Exchange) -> None:
        exchange.write(b"HTTP/1.1 200 OK\r\nX-Endless: ")
        while not exchange.peer.client_left.is_set():
            exchange.write(b"v" * 65536)
            try:
                await exchange.peer.writer.drain()
            except ConnectionError:
                exchange.peer.client_left.set()
        exchange.keep = False

    async with running(endless_head) as origin, pool_for(origin.url) as pool:
        with pytest.raises(UpstreamError, match="head is over"):
            await pool.request("GET", "/a", [])
        await origin.peers[0].client_left.wait()


async def test_too_many_response_headers_are_refused() -> None:
    async def many(exchange: Exchange) -> None:
        exchange.write(response_bytes(b"", *(f"X-H{n}: v" for n in range(200))))

    async with running(many) as origin, pool_for(origin.url) as pool:
        with pytest.raises(UpstreamError, match="more than 128 headers"):
            await pool.request("GET", "/a", [])


async def test_an_invalid_answer_is_an_upstream_error() -> None:
    async def garbage(exchange: Exchange) -> None:
        exchange.write(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")

    async with running(garbage) as origin, pool_for(origin.url) as pool:
        with pytest.raises(UpstreamError, match="not valid HTTP"):
            await pool.request("GET", "/a", [])


async def test_an_unasked_protocol_switch_is_refused() -> None:
    async def switch(exchange: Exchange) -> None:
        exchange.write(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n"
        )

    async with running(switch) as origin, pool_for(origin.url) as pool:
        with pytest.raises(UpstreamError, match="switched protocols"):
            await pool.request("GET", "/a", [])


# Connecting -------------------------------------------------------------------------------


async def test_a_refused_connection_is_an_upstream_connect_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with pool_for(f"http://127.0.0.1:{port}") as pool:
        with pytest.raises(UpstreamConnectError, match=f"127.0.0.1:{port}"):
            await pool.request("GET", "/a", [])


async def test_a_server_that_never_finishes_the_handshake_times_out() -> None:
    accepted = asyncio.Event()
    left = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set()
        await reader.read()  # a TLS ClientHello, never answered; then the client gives up
        writer.close()
        left.set()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with pool_for(f"https://127.0.0.1:{port}", connect_timeout=0.2) as pool:
            with pytest.raises(UpstreamConnectError, match=r"within 0\.2 s"):
                await pool.request("GET", "/a", [])
        assert accepted.is_set()
        await left.wait()
    finally:
        server.close()
        await server.wait_closed()


def make_pki() -> tuple[CertificateAuthority, ssl.SSLContext]:
    """A CA, and a server context for 127.0.0.1 that requires a client certificate of it."""
    ca = CertificateAuthority.create("test API server CA")
    issued = ca.issue_server_certificate(["127.0.0.1"], timedelta(days=1))
    assert issued.key_pem is not None
    return ca, server_context(
        issued.cert_pem, issued.key_pem, ca.cert_pem, require_client_cert=True
    )


def kube_api_with_client_certificate(url: str, ca: CertificateAuthority, tmp_path: Path) -> KubeApi:
    """A KubeApi as a kubeconfig with a client certificate makes it."""
    key = generate_private_key()
    issued = ca.sign_client_csr(
        make_csr(key, "agent"), "agent", timedelta(days=1), datetime.now(UTC)
    )
    (tmp_path / "ca.pem").write_bytes(ca.cert_pem)
    (tmp_path / "client.pem").write_bytes(issued.cert_pem)
    (tmp_path / "client-key.pem").write_bytes(private_key_to_pem(key))
    configuration = kube_client.Configuration(host=url)
    configuration.ssl_ca_cert = str(tmp_path / "ca.pem")
    configuration.cert_file = str(tmp_path / "client.pem")
    configuration.key_file = str(tmp_path / "client-key.pem")
    return KubeApi(configuration)


async def test_tls_with_the_kube_api_context_presents_the_client_certificate(
    tmp_path: Path,
) -> None:
    ca, context = make_pki()

    async def who(exchange: Exchange) -> None:
        peer = exchange.peer.writer.get_extra_info("peercert")
        subject = dict(pair[0] for pair in peer["subject"])
        exchange.write(response_bytes(subject["commonName"].encode()))

    async with running(who, context) as origin:
        api = kube_api_with_client_certificate(origin.url, ca, tmp_path)
        assert api.base_url.startswith("https://")
        async with pool_for(api.base_url, ssl_context=api.ssl_context) as pool:
            assert await read_all(pool, "GET", "/a") == b"agent"
            assert await read_all(pool, "GET", "/b") == b"agent"
            assert [exchange.peer.number for exchange in origin.exchanges] == [0, 0]
        await api.close()


async def test_tls_to_a_server_of_another_ca_is_refused_as_untrusted(tmp_path: Path) -> None:
    _, context = make_pki()
    other = CertificateAuthority.create("another CA")
    async with running(ok, context) as origin:
        async with pool_for(origin.url, ssl_context=client_context(other.cert_pem)) as pool:
            with pytest.raises(UpstreamConnectError, match="does not trust"):
                await pool.request("GET", "/a", [])
        assert origin.exchanges == []
