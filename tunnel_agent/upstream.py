"""A small HTTP/1.1 client for relayed requests to the Kubernetes API server.

The agent's relay (:mod:`tunnel_agent.kubeproxy`) sends every request that is
not an upgrade or a HEAD through an :class:`UpstreamPool`: keep-alive
connections to the one API server, each an :class:`asyncio.Protocol` feeding
httptools' C parser (llhttp). Profiling showed aiohttp's client at ~38 % of the
agent's CPU per request; this client does what the relay needs and no more
(docs/benchmarks.md, "Kubernetes API proxy").

- Connections are reused last-in first-out; at most ``max_idle`` wait idle, the
  others are closed. One that the server closed while idle is dropped; one that
  the server closes before answering (a race with its idle timeout) is retried
  once on a fresh connection if no request body byte was read yet.
- The request body is streamed: exactly ``content-length`` bytes when the head
  has one, else ``transfer-encoding: chunked``.
- The response body is handed out as it arrives, with backpressure: reading
  from the API server pauses while more than 4 chunks or 256 KiB wait.
- A connect timeout, no body timeout (watches and ``logs -f`` stay open).
  Closing a response before its end closes the connection, so a watch the
  caller left ends at the API server at once.

Errors (all :class:`~tunnel_agent.errors.AgentError`)::

    UpstreamError                the API server cannot be reached, or its answer cannot be relayed
    ├── UpstreamConnectError     no connection (refused, unknown host, TLS, timeout)
    └── UpstreamRequestError     the request cannot be sent as it is (unsafe text, body length)

Messages name the API server's address, never a header value.
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import cast
from urllib.parse import urlsplit

import httptools

from protocol.errors import TunnelError
from protocol.http import MAX_HEADER_VALUE, MAX_HEADERS, MAX_RESPONSE_HEAD

from .errors import AgentError

__all__ = [
    "BodyReader",
    "UpstreamConnectError",
    "UpstreamError",
    "UpstreamPool",
    "UpstreamRequestError",
    "UpstreamResponse",
]

logger = logging.getLogger(__name__)

#: Reads the next bytes of a request body; b"" at its end. Like ``MuxStream.read``,
#: it must lose nothing when cancelled while it waits (a retry reads again).
BodyReader = Callable[[], Awaitable[bytes]]

#: Idle keep-alive connections kept; more are closed as they come back. Above
#: the concurrency callers reach (kubectl's discovery sends ~50 requests at
#: once), or every burst closes and reopens connections: at 32, a benchmark at
#: concurrency 64 spent 7 % of the agent's CPU connecting.
MAX_IDLE = 128
#: Seconds to connect (TCP and TLS handshake) before giving up.
CONNECT_TIMEOUT = 10.0
#: Reading from the API server pauses while more than this waits to be relayed.
HIGH_WATER_CHUNKS = 4
HIGH_WATER_BYTES = 256 * 1024
#: Bound of a response head's text (reason, names, values). The relay re-encodes
#: the head as msgpack within the protocol's bound (docs/protocol.md, "HTTP
#: streams"): there each byte >= 0x80 of a latin-1 value takes two, and the map
#: itself takes under 2 KiB more.
MAX_HEAD_BYTES = (MAX_RESPONSE_HEAD - 2048) // 2

# Framing and connection management belong to this client: given ones are ignored.
_OWN_HEADERS = frozenset({"host", "connection", "keep-alive", "transfer-encoding", "upgrade"})
_METHOD = re.compile(r"[A-Z]{1,16}")
# The request target: no space and no control character may break the request line.
_UNSAFE_TARGET = re.compile(r"[\x00-\x20\x7f-\x9f]")
_NAME_CHARS = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
# Names joined by single spaces (as many as names less one): each a non-empty RFC 9110 token.
_TOKENS = re.compile(f"{_NAME_CHARS}(?: {_NAME_CHARS})*")
# Values joined by a tab (which values may hold): no other control character.
_UNSAFE_VALUES = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_DIGITS = re.compile(r"[0-9]{1,18}")


class UpstreamError(AgentError):
    """The API server cannot be reached, or its answer cannot be relayed."""


class UpstreamConnectError(UpstreamError):
    """No connection to the API server: refused, unknown host, TLS failure, timeout."""


class UpstreamRequestError(UpstreamError):
    """The request cannot be sent as it is: unsafe characters, or a body of the wrong length."""


class _StaleConnectionError(UpstreamError):
    """The API server closed the connection before any byte of an answer."""


class _Refused(Exception):
    """Stops the parser from a callback; the reason is in ``_Connection.error``."""


class UpstreamPool:
    """Keep-alive HTTP/1.1 connections to one API server, and requests on them.

    ``base_url`` is the API server's URL (``https://host:port``, optionally with
    a path prefix); with ``https``, ``ssl_context`` verifies the server and may
    present a client certificate (anything other than a context means a
    default, verifying one: this client never skips verification).
    """

    def __init__(
        self,
        base_url: str,
        ssl_context: ssl.SSLContext | bool | None = None,
        *,
        max_idle: int = MAX_IDLE,
        connect_timeout: float = CONNECT_TIMEOUT,
    ) -> None:
        split = urlsplit(base_url)
        if split.scheme not in ("http", "https") or not split.hostname:
            raise UpstreamError(
                f"the API server URL {split.scheme}://{split.hostname or ''} is not usable: "
                "give http(s)://host[:port]"
            )
        self.host = split.hostname
        self.port = split.port or (443 if split.scheme == "https" else 80)
        self._ssl: ssl.SSLContext | None = None
        if split.scheme == "https":
            if isinstance(ssl_context, ssl.SSLContext):
                self._ssl = ssl_context
            else:
                self._ssl = ssl.create_default_context()
        # The Host header: the URL's authority as written, without any user info.
        self._authority = split.netloc.rpartition("@")[2]
        self._prefix = split.path.rstrip("/")
        self._where = f"{split.scheme}://{self._authority}"
        self.max_idle = max_idle
        self.connect_timeout = connect_timeout
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()
        self._closed = False

    @property
    def idle_connections(self) -> int:
        """Connections waiting in the pool for a request."""
        return len(self._idle)

    @property
    def open_connections(self) -> int:
        """Connections open, busy or idle."""
        return len(self._open)

    async def request(
        self,
        method: str,
        path: str,
        headers: Sequence[tuple[str, str]],
        body: BodyReader | None = None,
    ) -> UpstreamResponse:
        """Send a request; return the response once its head has come.

        ``path`` (with its query) is appended to the base URL as it is.
        ``body`` is None when the request has none; otherwise it is read to
        its end while the response comes. Host, Connection, Transfer-Encoding
        and Upgrade are this client's own: given ones are ignored. Use the
        response as a context manager (``with response:``) so that the
        connection goes back to the pool or is closed.

        Raises :class:`UpstreamRequestError` for a request that cannot be sent
        (unsafe characters, a bad content-length, a body that does not match
        it), :class:`UpstreamConnectError` when no connection can be made, and
        :class:`UpstreamError` when the answer is invalid or too large.
        """
        if method == "HEAD":
            # llhttp cannot be told that an answer to HEAD has no body.
            raise ValueError("HEAD requests are not supported by this client")
        if self._closed:
            raise UpstreamError("the agent is stopping: no new requests to the API server")
        head, length = self._encode_head(method, path, headers, has_body=body is not None)
        if body is None and length:
            raise UpstreamRequestError(
                f"the request announces a body of {length} bytes but carries none"
            )
        for attempt in (1, 2):
            connection = self._take() if attempt == 1 else None
            reused = connection is not None
            if connection is None:
                connection = await self._connect()
            try:
                connection.begin(head, body, length)
                await connection.wait_head()
            except _StaleConnectionError:
                connection.abort()
                if reused and not connection.body_consumed:
                    logger.debug("%s closed an idle connection; retrying", self._where)
                    continue
                raise
            except BaseException:
                connection.abort()
                raise
            return UpstreamResponse(self, connection)
        raise AssertionError("unreachable: the second attempt returns or raises")

    async def close(self) -> None:
        """Close every connection, idle or busy; later requests are refused."""
        self._closed = True
        connections = list(self._open)
        self._idle.clear()
        for connection in connections:
            connection.abort()
        await asyncio.gather(*(connection.closed for connection in connections))

    # Connections.

    def _take(self) -> _Connection | None:
        while self._idle:
            connection = self._idle.pop()
            if connection.reusable:
                return connection
            connection.abort()
        return None

    def _give_back(self, connection: _Connection) -> None:
        if len(self._idle) >= self.max_idle or self._closed:
            connection.close()
        else:
            connection.idle()
            self._idle.append(connection)

    def _forget(self, connection: _Connection) -> None:
        """A connection was lost: it is no longer open, nor idle."""
        self._open.discard(connection)
        if connection in self._idle:
            self._idle.remove(connection)

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        where = self._where
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, connection = await loop.create_connection(
                    lambda: _Connection(self),
                    self.host,
                    self.port,
                    ssl=self._ssl,
                    server_hostname=self.host if self._ssl is not None else None,
                )
        except TimeoutError as exc:
            raise UpstreamConnectError(
                f"cannot connect to the API server at {where} within "
                f"{self.connect_timeout:g} s: check that it is up and reachable from the agent"
            ) from exc
        except ssl.SSLCertVerificationError as exc:
            raise UpstreamConnectError(
                f"the API server at {where} presented a certificate the agent does not trust "
                f"({exc.verify_message}): check the CA of the kubeconfig or service account"
            ) from exc
        except ssl.SSLError as exc:
            raise UpstreamConnectError(
                f"the TLS handshake with the API server at {where} failed: {exc.reason or exc}"
            ) from exc
        except OSError as exc:
            raise UpstreamConnectError(
                f"cannot connect to the API server at {where}: {exc.strerror or exc}"
            ) from exc
        if self._closed:
            connection.abort()
            raise UpstreamError("the agent is stopping: no new requests to the API server")
        return connection

    # The request head.

    def _encode_head(
        self, method: str, path: str, headers: Sequence[tuple[str, str]], *, has_body: bool
    ) -> tuple[bytes, int | None]:
        """The request head's bytes and the body length it announces (None: none).

        A body without a content-length goes chunked.
        """
        if _METHOD.fullmatch(method) is None:
            raise UpstreamRequestError(f"the method {method[:16]!r} cannot be sent")
        if not path.startswith("/") or _UNSAFE_TARGET.search(path) is not None:
            raise UpstreamRequestError(
                "the request path holds a space or a control character: it cannot be sent"
            )
        lines = [f"{method} {self._prefix}{path} HTTP/1.1\r\nhost: {self._authority}\r\n"]
        names: list[str] = []
        values: list[str] = []
        length: int | None = None
        for name, value in headers:
            lower = name.lower()
            if lower in _OWN_HEADERS:
                continue
            if lower == "content-length":
                if length is not None or _DIGITS.fullmatch(value) is None:
                    raise UpstreamRequestError(
                        "the request needs one content-length of decimal digits"
                    )
                length = int(value)
            names.append(name)
            values.append(value)
            lines.append(f"{name}: {value}\r\n")
        # One check over all names and one over all values: each header checked
        # alone would cost as much as the rest of the head's encoding.
        joined = " ".join(names)
        if names and (_TOKENS.fullmatch(joined) is None or joined.count(" ") != len(names) - 1):
            raise UpstreamRequestError(f"the header name {_bad_name(names)!r} cannot be sent")
        if _UNSAFE_VALUES.search("\t".join(values)) is not None:
            culprit = next(
                n for n, v in zip(names, values, strict=True) if _UNSAFE_VALUES.search(v)
            )
            raise UpstreamRequestError(
                f"the value of the {culprit} header holds a control character (CR, LF ...): "
                "it cannot be sent"
            )
        if has_body and length is None:
            lines.append("transfer-encoding: chunked\r\n")
        lines.append("\r\n")
        try:
            # UTF-8, as aiohttp sent it; surrogateescape gives back bytes the
            # caller sent that were not UTF-8. Neither can make a CR or LF byte.
            return "".join(lines).encode("utf-8", "surrogateescape"), length
        except UnicodeEncodeError as exc:
            raise UpstreamRequestError("the request head is not valid text") from exc


def _bad_name(names: list[str]) -> str:
    return next((name for name in names if re.fullmatch(_NAME_CHARS, name) is None), "")[:64]


class UpstreamResponse:
    """The answer of the API server: head, then its body as it arrives.

    Use as ``with response:``; leaving returns the connection to the pool when
    the answer was read to its clean end, and closes it otherwise (an error,
    cancellation, a body left unread).
    """

    def __init__(self, pool: UpstreamPool, connection: _Connection) -> None:
        self._pool = pool
        self._connection = connection
        self._released = False
        self.status = connection.status
        self.reason = connection.reason
        #: (name, value) pairs, names in lower case, as they came.
        self.headers = connection.headers

    @property
    def buffered(self) -> int:
        """Body bytes received from the API server and not read yet."""
        return self._connection.queued

    @property
    def reading_paused(self) -> bool:
        """True while reading from the API server waits for the relay (backpressure)."""
        return self._connection.paused

    async def read(self) -> bytes:
        """The next body bytes; b"" at the body's clean end.

        Raises :class:`UpstreamError` if the answer breaks off or is invalid.
        """
        connection = self._connection
        while True:
            if connection.chunks:
                return connection.take()
            if connection.error is not None:
                raise connection.error
            if connection.complete:
                return b""
            await connection.wait()

    def read_nowait(self) -> bytes:
        """Body bytes that have already come, without waiting; b"" if none wait."""
        connection = self._connection
        return connection.take() if connection.chunks else b""

    def close(self) -> None:
        """Give the connection back if the answer ended cleanly; else close it."""
        if self._released:
            return
        self._released = True
        connection = self._connection
        if connection.finish():
            self._pool._give_back(connection)
        else:
            connection.abort()

    def __enter__(self) -> UpstreamResponse:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _Connection(asyncio.Protocol):
    """One connection to the API server, one exchange at a time."""

    def __init__(self, pool: UpstreamPool) -> None:
        self._pool = pool
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
        self._pool._open.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.reusable = False
        self._pool._forget(self)
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)
        if self._busy and not self.complete and self.error is None:
            if not self.received:
                self.error = _StaleConnectionError(
                    f"the API server at {self._pool._where} closed the connection without answering"
                )
            elif self.head_done and self._close_delimited():
                self.complete = True  # the body ended with the connection, as announced
            else:
                self.error = UpstreamError(
                    f"the API server at {self._pool._where} closed the connection "
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
        self.reason = status.decode("latin-1")
        self._head_size += len(status)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_size += len(name) + len(value)
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
