"""What a session needs from a WebSocket: whole binary messages both ways."""

from __future__ import annotations

from typing import Protocol

__all__ = ["MessageTransport", "TransportClosed"]


class TransportClosed(Exception):
    """Raised by a transport whose socket has closed."""


class MessageTransport(Protocol):
    """A message-oriented, ordered, reliable transport (a WebSocket).

    ``send`` accepts the message before it first suspends (a WebSocket
    writes it to its socket's buffer at once), then waits while that buffer is
    above its high-water mark (backpressure): so two tasks sending at once keep
    their messages' order, and one cancelled while it waits loses nothing.
    ``receive`` returns the next whole binary message. Both raise
    :class:`TransportClosed` once the socket is closed.
    """

    async def send(self, message: bytes) -> None: ...

    async def receive(self) -> bytes: ...

    async def close(self, reason: str = "") -> None: ...
