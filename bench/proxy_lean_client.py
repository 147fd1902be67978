"""An experiment: the agent's relay to the API server without aiohttp's client.

``--patch lean-client`` (bench/proxy_patches.py) replaces
:meth:`tunnel_agent.kubeproxy.KubeProxy._request` in the benchmark's agent
with the smallest relay that serves what the benchmark sends (requests
without a body, to a plain-HTTP upstream): a pool of keep-alive connections,
each an :class:`asyncio.Protocol` feeding httptools' C parser (llhttp), the
body handed to the stream as it arrives. It measures what the proposed data
plane ("a relay without aiohttp on the request path", docs/benchmarks.md)
would gain before anyone writes it; it is not product code and handles no
request body, upgrade, TLS or error path that the benchmark does not use.
Needs ``pip install httptools`` in the venv.
"""

from __future__ import annotations

import asyncio
import importlib
from collections import deque
from typing import Any
from urllib.parse import urlsplit

__all__ = ["install"]

_HIGH_WATER = 4


class _Response(asyncio.Protocol):
    """One keep-alive connection; parses one response at a time."""

    def __init__(self) -> None:
        # Imported by name: an optional benchmark tool, not a dependency of the project.
        httptools = importlib.import_module("httptools")
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self._begin()

    def _begin(self) -> None:
        self.headers: list[tuple[str, str]] = []
        self.head = asyncio.get_running_loop().create_future()
        self.chunks: deque[bytes] = deque()
        self.more = asyncio.Event()
        self.complete = False
        self.paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if not self.head.done():
            self.head.set_exception(ConnectionError("the upstream closed the connection"))
        self.more.set()

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.decode("latin-1").lower(), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        self.head.set_result(self._parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.more.set()
        if len(self.chunks) >= _HIGH_WATER and self.transport is not None:
            self.transport.pause_reading()
            self.paused = True

    def on_message_complete(self) -> None:
        self.complete = True
        self.more.set()

    def next_chunk_ready(self) -> None:
        if self.paused and len(self.chunks) < _HIGH_WATER and self.transport is not None:
            self.transport.resume_reading()
            self.paused = False

    def reuse(self) -> None:
        self._begin()


class _Pool:
    def __init__(self, base_url: str) -> None:
        split = urlsplit(base_url)
        self.host = split.hostname or "127.0.0.1"
        self.port = split.port or 80
        self.idle: list[_Response] = []

    async def take(self) -> _Response:
        while self.idle:
            connection = self.idle.pop()
            if not connection.lost:
                connection.reuse()
                return connection
        loop = asyncio.get_running_loop()
        _, protocol = await loop.create_connection(_Response, self.host, self.port)
        return protocol

    def give_back(self, connection: _Response) -> None:
        if not connection.lost:
            self.idle.append(connection)


def install() -> None:
    """Replace KubeProxy._request in this process."""
    from protocol.http import encode_response_head
    from tunnel_agent.kubeproxy import _DROPPED_RESPONSE, KubeProxy
    from tunnel_mux import MuxStream

    pools: dict[int, _Pool] = {}

    async def _request(
        self: KubeProxy, stream: MuxStream, head: Any, headers: list[tuple[str, str]]
    ) -> None:
        pool = pools.get(id(self))
        if pool is None:
            pool = pools[id(self)] = _Pool(self.api.base_url)
        connection = await pool.take()
        assert connection.transport is not None
        lines = [f"{head.method} {head.path} HTTP/1.1", f"Host: {pool.host}:{pool.port}"]
        lines += [f"{name}: {value}" for name, value in headers]
        connection.transport.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        status = await connection.head
        self.requests[(head.method.lower(), status)] += 1
        kept = [(n, v) for n, v in connection.headers if n not in _DROPPED_RESPONSE]
        await stream.write(encode_response_head(status, "", kept))
        try:
            while True:
                while connection.chunks:
                    chunk = connection.chunks.popleft()
                    connection.next_chunk_ready()
                    await stream.write(chunk)
                if connection.complete or connection.lost:
                    break
                connection.more.clear()
                if not connection.chunks and not connection.complete:
                    await connection.more.wait()
        except BaseException:
            if connection.transport is not None:
                connection.transport.close()
            raise
        stream.end()
        if connection.complete:
            pool.give_back(connection)

    KubeProxy._request = _request  # type: ignore[method-assign]
