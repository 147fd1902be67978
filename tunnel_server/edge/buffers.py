"""The front door's two buffers: the request body toward the agent, the answer toward the caller.

:class:`RequestBody` holds what the caller sent of a body until the upload
takes it, pausing the caller's socket past :data:`BODY_HIGH_WATER`, and can
drop the rest of a body answered early. :class:`AnswerOutput` gathers an
answer's ready bytes so that they go out in one write.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

__all__ = ["BODY_HIGH_WATER", "JOIN_LIMIT", "AnswerOutput", "RequestBody"]

#: Request body bytes held for the agent before the caller's socket is paused.
BODY_HIGH_WATER = 256 * 1024
#: Gathered parts up to this size are joined into one write.
JOIN_LIMIT = 16 * 1024


class RequestBody:
    """The body of the request in progress, on its way to the agent, bounded."""

    def __init__(self, length: int, pause: Callable[[], None], resume: Callable[[], None]) -> None:
        self.remaining = length
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self._pause = pause
        self._resume = resume
        self._more = asyncio.Event()
        self._failed = False
        self._on_discarded: Callable[[], object] | None = None

    @property
    def complete(self) -> bool:
        """Every byte of the body was received from the caller."""
        return self.remaining == 0

    @property
    def wants_more(self) -> bool:
        """More of the body is to come, and there is room to hold it."""
        return self.remaining > 0 and self._size <= BODY_HIGH_WATER

    def feed(self, data: bytes) -> bytes:
        """Take the body's part of ``data``; return what follows it."""
        if not data or self.remaining == 0:
            return data
        taken = data[: self.remaining]
        self.remaining -= len(taken)
        if self._on_discarded is not None:
            if self.remaining == 0:
                self._on_discarded()
            return data[len(taken) :]
        self._chunks.append(taken)
        self._size += len(taken)
        self._more.set()
        if self._size > BODY_HIGH_WATER and self.remaining:
            self._pause()
        return data[len(taken) :]

    def fail(self) -> None:
        """The caller went away: a reader waiting for more hears of it."""
        self._failed = True
        self._more.set()

    def discard(self, on_complete: Callable[[], object]) -> None:
        """Drop what is held and what comes; call ``on_complete`` at the body's end."""
        self._chunks.clear()
        self._size = 0
        self._on_discarded = on_complete

    async def read(self) -> bytes:
        """The next part of the body, b"" at its end; ConnectionError if the caller left."""
        while not self._chunks:
            if self._failed:
                raise ConnectionResetError("the caller went away")
            if self.remaining == 0:
                return b""
            self._more.clear()
            await self._more.wait()
        data = self._chunks.popleft()
        self._size -= len(data)
        if self._size <= BODY_HIGH_WATER // 2 and self.remaining:
            self._resume()
        return data


class AnswerOutput:
    """Bytes of an answer gathered to go out to the caller together.

    Small parts are joined (one TLS record, one system call for a small
    answer's head, body and last chunk); larger ones go out as a list, not
    copied once more.
    """

    def __init__(
        self, write: Callable[[bytes], None], writelines: Callable[[list[bytes]], None]
    ) -> None:
        self._write = write
        self._writelines = writelines
        self._parts: list[bytes] = []
        self.size = 0

    def add(self, data: bytes) -> None:
        self._parts.append(data)
        self.size += len(data)

    def flush(self) -> None:
        parts = self._parts
        if not parts:
            return
        if len(parts) == 1:
            self._write(parts[0])
        elif self.size <= JOIN_LIMIT:
            self._write(b"".join(parts))
        else:
            self._writelines(parts)
        self._parts = []
        self.size = 0
