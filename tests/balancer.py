"""A small TCP balancer on loopback, standing in for a Kubernetes Service.

Each connection goes to the next backend in turn that accepts it (TLS passes
through untouched, as through a Service with TLS passthrough); a backend
that refuses is skipped, as kube-proxy skips an endpoint that is not ready.
Bytes are copied both ways with the transports' own flow control.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

__all__ = ["Balancer", "running_balancer"]

#: Bytes read at once from either side.
CHUNK = 64 * 1024


@dataclass
class Balancer:
    """The balancer's port, its backends (changeable while it runs), and its counts."""

    backends: list[tuple[str, int]]
    port: int = 0
    #: Connections sent to each backend, by port.
    routed: dict[int, int] = field(default_factory=dict)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _turn: itertools.count[int] = field(default_factory=itertools.count)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            upstream = await self._connect()
            if upstream is None:
                return
            up_reader, up_writer = upstream
            try:
                await asyncio.gather(_copy(reader, up_writer), _copy(up_reader, writer))
            finally:
                up_writer.close()
        finally:
            writer.close()
            self._tasks.discard(task)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        start = next(self._turn)
        backends = list(self.backends)
        for offset in range(len(backends)):
            host, port = backends[(start + offset) % len(backends)]
            try:
                connected = await asyncio.open_connection(host, port)
            except OSError:
                continue
            self.routed[port] = self.routed.get(port, 0) + 1
            return connected
        return None

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def _copy(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while data := await source.read(CHUNK):
            sink.write(data)
            await sink.drain()
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            sink.write_eof()


@contextlib.asynccontextmanager
async def running_balancer(backends: list[tuple[str, int]]) -> AsyncIterator[Balancer]:
    balancer = Balancer(backends)
    server = await asyncio.start_server(balancer._serve, "127.0.0.1", 0)
    balancer.port = server.sockets[0].getsockname()[1]
    try:
        yield balancer
    finally:
        server.close()
        await balancer.close()
        await server.wait_closed()
