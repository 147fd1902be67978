"""The server's TLS listener, with a bound on handshakes in progress.

asyncio's own server accepts every connection at once and advances all their
TLS handshakes together; when thousands of agents reconnect after a restart,
none finishes for seconds and then hundreds do at once (docs/benchmarks.md,
"Idle agents"). This listener holds at most ``limit`` handshakes in
progress; the kernel's listen queue keeps the rest, first come first served.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable

__all__ = ["BoundedTlsListener"]

logger = logging.getLogger(__name__)


class BoundedTlsListener:
    """Serves ``factory``'s protocol over TLS on host:port."""

    def __init__(
        self,
        factory: Callable[[], asyncio.Protocol],
        host: str,
        port: int,
        ssl_context: ssl.SSLContext,
        *,
        limit: int = 64,
        handshake_timeout: float = 10.0,
        backlog: int = 4096,
    ) -> None:
        self._factory = factory
        self._host = host
        self._port = port
        self._ssl = ssl_context
        self._limit = limit
        self._handshake_timeout = handshake_timeout
        self._backlog = backlog
        self._socket: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._handshakes: set[asyncio.Task[object]] = set()

    async def start(self) -> int:
        """Listen; return the bound port (useful with port 0)."""
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        listener = socket.create_server(
            (self._host, self._port), family=family, backlog=self._backlog
        )
        listener.setblocking(False)
        self._socket = listener
        self._accepting = asyncio.create_task(self._accept_forever(), name="TLS listener")
        port: int = listener.getsockname()[1]
        return port

    async def stop(self) -> None:
        """Stop accepting; abandon handshakes not yet finished."""
        tasks = [task for task in (self._accepting, *self._handshakes) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    async def _accept_forever(self) -> None:
        assert self._socket is not None
        loop = asyncio.get_running_loop()
        slots = asyncio.Semaphore(self._limit)
        while True:
            await slots.acquire()
            try:
                connection, _ = await loop.sock_accept(self._socket)
            except OSError as exc:  # e.g. EMFILE: back off a moment, keep serving
                slots.release()
                logger.warning("cannot accept a connection: %s", exc)
                await asyncio.sleep(0.1)
                continue
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            task: asyncio.Task[object] = asyncio.create_task(
                loop.connect_accepted_socket(
                    self._factory,
                    connection,
                    ssl=self._ssl,
                    ssl_handshake_timeout=self._handshake_timeout,
                )
            )
            self._handshakes.add(task)
            task.add_done_callback(lambda done: self._finished(done, slots))

    def _finished(self, task: asyncio.Task[object], slots: asyncio.Semaphore) -> None:
        self._handshakes.discard(task)
        slots.release()
        if not task.cancelled():
            with contextlib.suppress(Exception):
                # A failed handshake (bad certificate, timeout, probe) has
                # closed its socket; there is nothing else to do with it.
                task.exception()
