"""What a session needs from a WebSocket: whole binary messages both ways."""

from __future__ import annotations

from typing import Protocol

__all__ = ["MessageTransport", "TransportClosed"]


class TransportClosed(Exception):
    """Raised by a transport whose socket has closed."""


class MessageTransport(Protocol):
    """A message-oriented, ordered, reliable transport (a WebSocket).

    ``send`` returns once the message is accepted and waits while the socket's
    write buffer is above its high-water mark (backpressure); ``receive``
    returns the next whole binary message. Both raise :class:`TransportClosed`
    once the socket is closed.
    """

    async def send(self, message: bytes) -> None: ...

    async def receive(self) -> bytes: ...

    async def close(self, reason: str = "") -> None: ...
