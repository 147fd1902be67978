"""One stream of a session, as an async reader and writer."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from protocol.errors import ErrorCode

from .errors import SessionError, StreamResetError

if TYPE_CHECKING:
    from .session import Session

__all__ = ["MuxStream"]


class MuxStream:
    """A bidirectional byte stream multiplexed on a session.

    Reading takes data from a buffer the session fills; the peer's credit
    bounds it, and credit returns as :meth:`read` takes data. Writing waits
    while the stream's send buffer is full, so a slow peer slows this stream's
    writer alone.
    """

    def __init__(
        self,
        session: Session,
        stream_id: int,
        kind: str,
        headers: dict[str, Any],
        *,
        local: bool,
    ) -> None:
        self.id = stream_id
        self.kind = kind
        self.headers = headers
        #: Opened by this side.
        self.local = local
        self.bytes_read = 0
        self.bytes_written = 0
        self._session = session
        self._chunks: deque[bytes] = deque()
        self._eof = False
        self._write_closed = False
        self._error: SessionError | None = None
        self._readable = _Wakeup(session.loop)
        self._writable = _Wakeup(session.loop)

    def __repr__(self) -> str:
        return f"<MuxStream {self.id} {self.kind}>"

    @property
    def at_eof(self) -> bool:
        """True once the peer ended the stream and every byte has been read."""
        return self._eof and not self._chunks

    @property
    def read_ready(self) -> bool:
        """True if :meth:`read` would answer without waiting (data, the end, or an error)."""
        return bool(self._chunks) or self._eof or self._error is not None

    @property
    def error(self) -> SessionError | None:
        """Why the stream failed, if it did."""
        return self._error

    async def read(self, max_bytes: int = -1) -> bytes:
        """The next bytes of the stream, or b"" once the peer has ended it.

        Raises :class:`StreamResetError` or ``SessionClosedError`` when the
        stream or the session failed; data not yet read is then dropped.
        """
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self._eof:
                return b""
            await self._readable.wait(self.id, "read")
        if self._error is not None:
            raise self._error
        chunk = self._chunks.popleft()
        if 0 < max_bytes < len(chunk):
            self._chunks.appendleft(chunk[max_bytes:])
            chunk = chunk[:max_bytes]
        self.bytes_read += len(chunk)
        self._session._acknowledge(self.id, len(chunk))
        return chunk

    async def read_all(self, limit: int) -> bytes:
        """Everything until the peer ends the stream, refusing more than ``limit`` bytes."""
        parts: list[bytes] = []
        size = 0
        while chunk := await self.read():
            size += len(chunk)
            if size > limit:
                self.reset(ErrorCode.CANCEL, "too much data")
                raise SessionError(f"stream {self.id} carried more than {limit} bytes")
            parts.append(chunk)
        return b"".join(parts)

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        """Send data, waiting while the stream's send buffer is full."""
        view = memoryview(data if isinstance(data, bytes) else bytes(data))
        while view:
            self._check_writable()
            capacity = self._session._send_capacity(self.id)
            if capacity <= 0:
                self._session._wait_writable(self)
                started = time.monotonic()
                await self._writable.wait(self.id, "written")
                self._session.flow_wait_seconds += time.monotonic() - started
                continue
            size = min(capacity, len(view))
            self._session._send_data(self.id, view[:size])
            self.bytes_written += size
            view = view[size:]
        await self._session.send_if_due()

    def end(self) -> None:
        """Half-close: no more data from this side. Reading goes on."""
        if self._write_closed or self._error is not None:
            return
        self._write_closed = True
        self._session._end_stream(self.id)

    def reset(self, code: int = ErrorCode.CANCEL, reason: str = "") -> None:
        """Abort the stream in both directions."""
        if self._error is None:
            self._session._reset_stream(self.id, code, reason)
            self._fail(StreamResetError(code, reason, remote=False))

    async def __aenter__(self) -> MuxStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if exc_info[0] is not None:
            self.reset(ErrorCode.CANCEL, "the handler failed")
        else:
            self.end()

    # Called by the session.

    def _check_writable(self) -> None:
        if self._error is not None:
            raise self._error
        if self._write_closed:
            raise SessionError(f"stream {self.id} was already ended by this side")

    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._readable.wake()

    def _feed_eof(self) -> None:
        self._eof = True
        self._readable.wake()

    def _fail(self, error: SessionError) -> None:
        if self._error is None:
            self._error = error
            self._chunks.clear()
        self._readable.wake()
        self._writable.wake()

    def _wake_writer(self) -> None:
        self._writable.wake()


class _Wakeup:
    """Wakes the one task waiting on it; its future is made only when one waits.

    What a stream needs of an ``asyncio.Event``, for less: most streams (one
    small request and its answer) never wait to write, and a reader or writer
    checks the stream's state again after every wake-up, so a wake-up with
    nobody waiting may be dropped.
    """

    __slots__ = ("_loop", "_waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._waiter: asyncio.Future[None] | None = None

    async def wait(self, stream_id: int, verb: str) -> None:
        # A waiter already done belongs to a task that was cancelled or woken
        # and has not run since: taking its place is safe.
        if self._waiter is not None and not self._waiter.done():
            raise RuntimeError(f"stream {stream_id} is already being {verb} by another task")
        waiter = self._waiter = self._loop.create_future()
        try:
            await waiter
        finally:
            if self._waiter is waiter:
                self._waiter = None

    def wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
