"""An in-memory message transport pair with bounded buffers (real backpressure)."""

from __future__ import annotations

import asyncio
from collections import deque

from tunnel_mux import TransportClosed


class _Direction:
    """Messages from one end to the other: accepted at once, then held to ``depth``."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.messages: deque[bytes] = deque()
        self.closed = False
        self._readable: asyncio.Future[None] | None = None
        self._room: asyncio.Future[None] | None = None

    async def wait_room(self) -> None:
        while len(self.messages) > self.depth and not self.closed:
            self._room = asyncio.get_running_loop().create_future()
            await self._room

    async def wait_readable(self) -> None:
        while not self.messages and not self.closed:
            self._readable = asyncio.get_running_loop().create_future()
            await self._readable

    def wake(self) -> None:
        for waiter in (self._readable, self._room):
            if waiter is not None and not waiter.done():
                waiter.set_result(None)


class MemoryTransport:
    """One end of a pair; a sender waits while more than ``depth`` messages are unread.

    As :class:`tunnel_mux.MessageTransport` asks, ``send`` accepts the message
    before it first suspends.
    """

    def __init__(self, inbox: _Direction, outbox: _Direction) -> None:
        self._inbox = inbox
        self._outbox = outbox
        self.closed = False
        self.sent = 0
        #: Sends that had to wait for the other end to read (backpressure).
        self.waited = 0

    @property
    def unread(self) -> int:
        """Messages this end has sent that the other has not received yet."""
        return len(self._outbox.messages)

    async def send(self, message: bytes) -> None:
        if self.closed or self._outbox.closed:
            raise TransportClosed
        self._outbox.messages.append(message)
        self.sent += 1
        self._outbox.wake()
        if len(self._outbox.messages) > self._outbox.depth:
            self.waited += 1
        await self._outbox.wait_room()

    async def receive(self) -> bytes:
        if self.closed:
            raise TransportClosed
        await self._inbox.wait_readable()
        if not self._inbox.messages:
            self.closed = True
            raise TransportClosed
        message = self._inbox.messages.popleft()
        self._inbox.wake()
        return message

    async def close(self, reason: str = "") -> None:
        if not self.closed:
            self.closed = True
            # Tell the other end once it has read what was sent before.
            self._outbox.closed = True
            self._outbox.wake()
            self._inbox.wake()


def transport_pair(depth: int = 8) -> tuple[MemoryTransport, MemoryTransport]:
    a_to_b = _Direction(depth)
    b_to_a = _Direction(depth)
    return MemoryTransport(b_to_a, a_to_b), MemoryTransport(a_to_b, b_to_a)
