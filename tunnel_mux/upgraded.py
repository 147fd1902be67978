"""The bytes of an aiohttp connection after a 101 Switching Protocols.

aiohttp lets a handler take over an upgraded connection by installing a
payload parser on its protocol (this is how its own WebSocket code works); an
:class:`UpgradedReader` is such a parser that simply queues the bytes, with
backpressure: reading pauses while more than a high-water mark is queued.
It serves both aiohttp's server and client protocols.
"""

from __future__ import annotations

import asyncio
from typing import cast

__all__ = ["UpgradedReader"]


class UpgradedReader:
    """Receives raw bytes from aiohttp's protocol; :meth:`read` hands them out."""

    def __init__(
        self, transport: asyncio.BaseTransport | None, high_water: int = 256 * 1024
    ) -> None:
        self._transport = transport
        self._high_water = high_water
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._held = 0
        self._paused = False
        self._error: BaseException | None = None

    # The parser and payload interface aiohttp's protocols call.

    def feed_data(self, data: bytes, size: int = 0) -> tuple[bool, bytes]:
        if data:
            self._queue.put_nowait(data)
            self._held += len(data)
            if self._held > self._high_water and not self._paused:
                self._pause(True)
        return False, b""

    def feed_eof(self) -> None:
        self._queue.put_nowait(None)

    def set_exception(self, exc: BaseException, exc_cause: BaseException | None = None) -> None:
        self._error = exc
        self._queue.put_nowait(None)

    # For the relay.

    async def read(self) -> bytes:
        """The next bytes; b"" at the end of the connection."""
        data = await self._queue.get()
        if data is None:
            self._queue.put_nowait(None)  # every later read sees the end too
            return b""
        self._held -= len(data)
        if self._paused and self._held < self._high_water // 2:
            self._pause(False)
        return data

    def _pause(self, pause: bool) -> None:
        # No isinstance check against asyncio.ReadTransport: uvloop's
        # transports have the same methods but are not its subclasses.
        transport = cast(asyncio.ReadTransport | None, self._transport)
        if transport is not None and not transport.is_closing():
            if pause:
                transport.pause_reading()
            else:
                transport.resume_reading()
        self._paused = pause
