"""A loopback stand-in for the API server, for the tests of the agent's HTTP/1.1 client.

An HTTP/1.1 server whose answers each test writes byte for byte, plain or TLS,
and small helpers around a pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from tunnel_agent.upstream import (
    BodyReader,
    UpstreamPool,
)


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


def first_answered_only() -> Answer:
    """Answers the origin's first request; every later one has its connection closed unanswered."""
    answered = False

    async def answer(exchange: Exchange) -> None:
        nonlocal answered
        if answered:
            exchange.keep = False
        else:
            answered = True
            await ok(exchange)

    return answer


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
