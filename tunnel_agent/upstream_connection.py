"""One keep-alive connection to the API server, for :mod:`tunnel_agent.upstream`.

An :class:`asyncio.Protocol` that carries one exchange at a time: it writes
the request head, streams the body from a reader (a task it owns), and feeds
what comes back to httptools' response parser (llhttp), keeping the head and
queueing body chunks for the reader with back-pressure (reading from the API
server pauses while more than :data:`HIGH_WATER_CHUNKS` chunks or
:data:`HIGH_WATER_BYTES` wait).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import cast

import httptools

from protocol.errors import TunnelError
from protocol.http import MAX_HEADER_VALUE, MAX_HEADERS, MAX_RESPONSE_HEAD
from tunnel_kube.tcp_keepalive import enable_tcp_keepalive

from .errors import UpstreamError, UpstreamRequestError

__all__ = [
    "HIGH_WATER_BYTES",
    "HIGH_WATER_CHUNKS",
    "MAX_HEAD_BYTES",
    "BodyReader",
    "StaleConnectionError",
    "UpstreamConnection",
]

logger = logging.getLogger(__name__)

#: Reads the next bytes of a request body; b"" at its end. Like ``MuxStream.read``,
#: it must lose nothing when cancelled while it waits (a retry reads again).
BodyReader = Callable[[], Awaitable[bytes]]

#: Reading from the API server pauses while more than this waits to be relayed.
HIGH_WATER_CHUNKS = 4
HIGH_WATER_BYTES = 256 * 1024
#: Bound of a response head's text (reason, names, values). The relay re-encodes
#: the head as msgpack within the protocol's bound (docs/protocol.md, "HTTP
#: streams"): there each byte >= 0x80 of a latin-1 value takes two, and the map
#: itself takes under 2 KiB more.
MAX_HEAD_BYTES = (MAX_RESPONSE_HEAD - 2048) // 2


class StaleConnectionError(UpstreamError):
    """The API server closed the connection before any byte of an answer."""


class _Refused(Exception):
    """Stops the parser from a callback; the reason is in ``UpstreamConnection.error``.

    Internal, never raised past the connection: not part of the error hierarchy.
    """


class UpstreamConnection(asyncio.Protocol):
    """One connection to the API server, one exchange at a time.

    ``where`` names the API server in messages; ``on_made`` and ``on_lost``
    tell the pool when the connection opens and when it is gone.
    """

    def __init__(
        self,
        where: str,
        on_made: Callable[[UpstreamConnection], None],
        on_lost: Callable[[UpstreamConnection], None],
    ) -> None:
        self._where = where
        self._on_made = on_made
        self._on_lost = on_lost
        self._loop = asyncio.get_running_loop()
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        #: Resolved when the connection is gone.
        self.closed: asyncio.Future[None] = self._loop.create_future()
        self.lost = False
        #: False once the connection must not carry another exchange.
        self.reusable = True
        self._busy = False
        self._waiter: asyncio.Future[None] | None = None
        self._write_paused = False
        self._drain_waiter: asyncio.Future[None] | None = None
        self._sender: asyncio.Task[None] | None = None
        self._reset()

    def _reset(self) -> None:
        """State of one exchange."""
        self.status = 0
        self.reason = ""
        self.headers: list[tuple[str, str]] = []
        self.head_done = False
        self.complete = False
        self.error: UpstreamError | None = None
        self.chunks: deque[bytes] = deque()
        self.queued = 0
        self.paused = False
        self.received = False
        self.body_consumed = False
        #: A byte of the body (or the end of an empty chunked one) went out.
        self.body_started = False
        self.body_sent = True
        self._head_size = 0
        self._head_received = 0
        self._interim = False

    # Driven by the pool and the response.

    def begin(self, head: bytes, body: BodyReader | None, length: int | None) -> None:
        """Start an exchange: send the head, and the body as it comes."""
        self._reset()
        self._busy = True
        transport = self.transport
        assert transport is not None
        transport.write(head)
        if body is not None:
            self.body_sent = False
            self._sender = self._loop.create_task(self._send_body(body, length))
            self._sender.add_done_callback(self._sender_done)

    async def wait_head(self) -> None:
        while not self.head_done:
            if self.error is not None:
                raise self.error
            await self.wait()

    async def wait(self) -> None:
        """Until the parser or the connection has news."""
        waiter = self._loop.create_future()
        self._waiter = waiter
        try:
            await waiter
        finally:
            self._waiter = None

    def take(self) -> bytes:
        chunk = self.chunks.popleft()
        self.queued -= len(chunk)
        if self.paused and not self.chunks:
            self.paused = False
            if not self.lost and self.transport is not None:
                self.transport.resume_reading()
        return chunk

    def finish(self) -> bool:
        """End the exchange; True if the connection may carry another."""
        self._busy = False
        sender = self._sender
        self._sender = None
        if sender is not None and not sender.done():
            sender.cancel()
        return (
            self.complete
            and self.error is None
            and self.reusable
            and self.body_sent
            and not self.chunks
            and not self.lost
        )

    def idle(self) -> None:
        """Wait in the pool: reading on, so a close by the server is seen."""
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        """Close at once, dropping what is not sent (the API server sees the end)."""
        self.reusable = False
        sender = self._sender
        if sender is not None and not sender.done():
            sender.cancel()
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, error: UpstreamError) -> None:
        if self.error is None and not self.complete:
            self.error = error
        self.abort()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # The request body.

    async def _send_body(self, read: BodyReader, length: int | None) -> None:
        try:
            await self._write_body(read, length)
        except UpstreamError as exc:
            self._fail(exc)
        except TunnelError as exc:
            self._fail(UpstreamRequestError(f"the request body could not be read: {exc}"))

    async def _write_body(self, read: BodyReader, length: int | None) -> None:
        transport = self.transport
        assert transport is not None
        sent = 0
        while chunk := await read():
            self.body_consumed = True
            if self.lost:
                return  # the answer side reports why
            sent += len(chunk)
            self.body_started = True
            if length is None:
                transport.writelines((b"%x\r\n" % len(chunk), chunk, b"\r\n"))
            elif sent > length:
                raise UpstreamRequestError(
                    f"the request body is longer than its content-length ({length} bytes)"
                )
            else:
                transport.write(chunk)
            await self._drain()
        if length is None:
            if not self.lost:
                self.body_started = True
                transport.write(b"0\r\n\r\n")
        elif sent < length:
            raise UpstreamRequestError(
                f"the request body ended after {sent} of its {length} bytes (content-length)"
            )
        self.body_sent = True

    def _sender_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            logger.error("sending a request body to the API server failed", exc_info=exc)
            self._fail(UpstreamError("the agent failed to send the request body"))

    async def _drain(self) -> None:
        while self._write_paused and not self.lost:
            waiter = self._loop.create_future()
            self._drain_waiter = waiter
            try:
                await waiter
            finally:
                self._drain_waiter = None

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A cast, not an isinstance check: uvloop's transports are not
        # subclasses of asyncio.Transport.
        self.transport = cast(asyncio.Transport, transport)
        enable_tcp_keepalive(transport)  # an API server whose node died sends no FIN
        self._on_made(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.reusable = False
        self._on_lost(self)
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)
        if self._busy and not self.complete and self.error is None:
            if not self.received:
                self.error = StaleConnectionError(
                    f"the API server at {self._where} closed the connection without answering"
                )
            elif exc is None and self.head_done and self._close_delimited():
                self.complete = True  # the body ended with the connection, as announced
            else:
                self.error = UpstreamError(
                    f"the API server at {self._where} closed the connection "
                    "before the end of its answer"
                )
        self._wake()
        if not self.closed.done():
            self.closed.set_result(None)

    def _close_delimited(self) -> bool:
        """True if the answer has neither a length nor chunks: it ends with the connection."""
        return not any(name in ("content-length", "transfer-encoding") for name, _ in self.headers)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)

    def data_received(self, data: bytes) -> None:
        if not self._busy or self.complete:
            # The server spoke out of turn: nothing it says now can be trusted.
            self.abort()
            return
        self.received = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(UpstreamError("the API server switched protocols without being asked"))
            return
        except httptools.HttpParserError as exc:
            if self.error is not None:  # a bound, set by a callback
                self._fail(self.error)
            else:
                self._fail(UpstreamError(f"the API server's answer is not valid HTTP: {exc}"))
            return
        if not self.head_done:
            # llhttp keeps an incomplete header line in memory: bound what it may hold.
            self._head_received += len(data)
            if self._head_received > MAX_HEAD_BYTES:
                self._fail(self._too_large())

    # httptools callbacks

    def on_status(self, status: bytes) -> None:
        # The reason may come in pieces when the status line spans reads.
        self.reason += status.decode("latin-1")
        self._head_size += len(status)

    def on_message_begin(self) -> None:
        if self.complete:
            # A second answer to one request, in the same read as the first:
            # the connection no longer says where an answer starts (the first
            # stands; the connection is closed).
            raise _Refused

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_size += len(name) + len(value)
        if self.head_done:
            # The trailer of a chunked answer: its head has gone; not relayed.
            if self._head_size > MAX_HEAD_BYTES:
                self.error = UpstreamError(
                    f"the API server's answer and its trailer are over {MAX_HEAD_BYTES} bytes "
                    "of fields: the tunnel cannot relay it"
                )
                raise _Refused
            return
        headers = self.headers
        if len(headers) >= MAX_HEADERS:
            self.error = UpstreamError(
                f"the API server's answer has more than {MAX_HEADERS} headers: "
                "the tunnel cannot relay it"
            )
            raise _Refused
        if len(value) > MAX_HEADER_VALUE:
            self.error = UpstreamError(
                f"the API server's answer has a header value over {MAX_HEADER_VALUE} bytes: "
                "the tunnel cannot relay it"
            )
            raise _Refused
        headers.append((name.lower().decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        if self._head_size > MAX_HEAD_BYTES:
            self.error = self._too_large()
            raise _Refused
        status = self._parser.get_status_code()
        if status == 101:
            self.error = UpstreamError("the API server switched protocols without being asked")
            raise _Refused
        if 100 <= status < 200:
            # An interim answer (100 Continue ...): the real one follows.
            self._interim = True
            self.headers = []
            self.reason = ""
            self._head_size = 0
            return
        codings = ",".join(value for name, value in self.headers if name == "transfer-encoding")
        if codings and codings.replace(" ", "").lower() != "chunked":
            # Its body would reach the caller still coded, and labelled as nothing.
            self.error = UpstreamError(
                f"the API server's answer has Transfer-Encoding {codings[:100]!r}: "
                "the tunnel relays chunked answers only"
            )
            raise _Refused
        self.status = status
        self.head_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.queued += len(body)
        if not self.paused and (
            len(self.chunks) > HIGH_WATER_CHUNKS or self.queued > HIGH_WATER_BYTES
        ):
            # The relay is slower than the API server: let TCP slow it down.
            assert self.transport is not None
            self.transport.pause_reading()
            self.paused = True
        self._wake()

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self.complete = True
        if not self._parser.should_keep_alive():
            self.reusable = False
        self._wake()

    def _too_large(self) -> UpstreamError:
        return UpstreamError(
            f"the API server's answer head is over {MAX_HEAD_BYTES} bytes: "
            "the tunnel cannot relay it"
        )
