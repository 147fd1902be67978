"""The message transport over an aiohttp WebSocket, server or client side."""

from __future__ import annotations

from typing import Protocol

import aiohttp

from .transport import TransportClosed

__all__ = ["AiohttpWebSocket", "WebSocketTransport"]


class AiohttpWebSocket(Protocol):
    """What aiohttp's server and client WebSockets have in common that we use."""

    @property
    def closed(self) -> bool: ...

    async def send_bytes(self, data: bytes, compress: int | None = None) -> None: ...

    async def receive(self, timeout: float | None = None) -> aiohttp.WSMessage: ...  # noqa: ASYNC109 - aiohttp's signature

    async def close(self, *, code: int = ..., message: bytes = ...) -> bool: ...


class WebSocketTransport:
    """Adapts ``web.WebSocketResponse`` or ``ClientWebSocketResponse`` for a Session.

    Only binary messages are part of the protocol; a text message or any
    socket error ends the transport. ``send`` keeps MessageTransport's promise
    (the message accepted before the first suspension) because both ends open
    the socket without compression: aiohttp writes an uncompressed frame at
    once, but compresses a large one in a task first.
    """

    def __init__(self, websocket: AiohttpWebSocket) -> None:
        self._websocket = websocket

    async def send(self, message: bytes) -> None:
        if self._websocket.closed:
            raise TransportClosed
        try:
            await self._websocket.send_bytes(message)
        except (ConnectionError, aiohttp.ClientError, RuntimeError) as exc:
            raise TransportClosed from exc

    async def receive(self) -> bytes:
        try:
            message = await self._websocket.receive()
        except (ConnectionError, aiohttp.ClientError) as exc:
            raise TransportClosed from exc
        if message.type is aiohttp.WSMsgType.BINARY:
            data: bytes = message.data
            return data
        raise TransportClosed

    async def close(self, reason: str = "") -> None:
        try:
            await self._websocket.close(code=aiohttp.WSCloseCode.OK, message=reason.encode()[:120])
        except (ConnectionError, aiohttp.ClientError, RuntimeError) as exc:
            raise TransportClosed from exc
