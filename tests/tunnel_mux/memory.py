"""An in-memory message transport pair with bounded queues (real backpressure)."""

from __future__ import annotations

import asyncio

from tunnel_mux import TransportClosed

_CLOSED = b""


class MemoryTransport:
    """One end of a pair; each direction holds at most ``depth`` messages."""

    def __init__(self, inbox: asyncio.Queue[bytes], outbox: asyncio.Queue[bytes]) -> None:
        self._inbox = inbox
        self._outbox = outbox
        self.closed = False
        self.sent = 0

    async def send(self, message: bytes) -> None:
        if self.closed:
            raise TransportClosed
        await self._outbox.put(message)
        self.sent += 1

    async def receive(self) -> bytes:
        if self.closed:
            raise TransportClosed
        message = await self._inbox.get()
        if message == _CLOSED:
            self.closed = True
            raise TransportClosed
        return message

    async def close(self, reason: str = "") -> None:
        if not self.closed:
            self.closed = True
            # Tell the other end, without waiting on a full queue.
            while True:
                try:
                    self._outbox.put_nowait(_CLOSED)
                    break
                except asyncio.QueueFull:
                    self._outbox.get_nowait()


def transport_pair(depth: int = 8) -> tuple[MemoryTransport, MemoryTransport]:
    a_to_b: asyncio.Queue[bytes] = asyncio.Queue(depth)
    b_to_a: asyncio.Queue[bytes] = asyncio.Queue(depth)
    return MemoryTransport(b_to_a, a_to_b), MemoryTransport(a_to_b, b_to_a)
