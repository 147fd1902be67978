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
  once on a fresh connection if the request is a GET or OPTIONS without a body,
  or has a body of which no byte was read or sent yet.
- The request body is streamed: exactly ``content-length`` bytes when the head
  has one, else ``transfer-encoding: chunked``.
- The response body is handed out as it arrives, with backpressure: reading
  from the API server pauses while more than 4 chunks or 256 KiB wait.
- A connect timeout, no body timeout (watches and ``logs -f`` stay open).
  Closing a response before its end closes the connection, so a watch the
  caller left ends at the API server at once.

Errors are :class:`~tunnel_agent.errors.UpstreamError` and its subclasses;
messages name the API server's address, never a header value. One connection
is :class:`tunnel_agent.upstream_connection.UpstreamConnection`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import ssl
from collections.abc import Sequence
from urllib.parse import urlsplit

from .errors import UpstreamConnectError, UpstreamError, UpstreamRequestError
from .upstream_connection import (
    HIGH_WATER_BYTES,
    HIGH_WATER_CHUNKS,
    BodyReader,
    StaleConnectionError,
    UpstreamConnection,
)

__all__ = [
    "HIGH_WATER_BYTES",
    "HIGH_WATER_CHUNKS",
    "BodyReader",
    "UpstreamConnectError",
    "UpstreamError",
    "UpstreamPool",
    "UpstreamRequestError",
    "UpstreamResponse",
    "check_sendable",
]

logger = logging.getLogger(__name__)

#: Idle keep-alive connections kept; more are closed as they come back. Above
#: the concurrency callers reach (kubectl's discovery sends ~50 requests at
#: once), or every burst closes and reopens connections: at 32, a benchmark at
#: concurrency 64 spent 7 % of the agent's CPU connecting.
MAX_IDLE = 128
#: Seconds to connect (TCP and TLS handshake) before giving up.
CONNECT_TIMEOUT = 10.0

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
        self._idle: list[UpstreamConnection] = []
        self._open: set[UpstreamConnection] = set()
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
        *,
        authorization: str | None = None,
    ) -> UpstreamResponse:
        """Send a request; return the response once its head has come.

        ``path`` (with its query) is appended to the base URL as it is.
        ``authorization`` is this client's own credential (the agent's), sent
        as the Authorization header after ``headers``.
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
        head, length = self._encode_head(
            method, path, headers, has_body=body is not None, authorization=authorization
        )
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
            except StaleConnectionError:
                connection.abort()
                if reused and _replayable(method, body is not None, connection):
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

    def _take(self) -> UpstreamConnection | None:
        while self._idle:
            connection = self._idle.pop()
            if connection.reusable:
                return connection
            connection.abort()
        return None

    def _give_back(self, connection: UpstreamConnection) -> None:
        if len(self._idle) >= self.max_idle or self._closed:
            connection.close()
        else:
            connection.idle()
            self._idle.append(connection)

    def _forget(self, connection: UpstreamConnection) -> None:
        """A connection was lost: it is no longer open, nor idle."""
        self._open.discard(connection)
        if connection in self._idle:
            self._idle.remove(connection)

    async def _connect(self) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        where = self._where
        try:
            # wait_for, not an async with: mypyc compiles this module (setup.py).
            _, connection = await asyncio.wait_for(
                loop.create_connection(
                    lambda: UpstreamConnection(where, self._open.add, self._forget),
                    self.host,
                    self.port,
                    ssl=self._ssl,
                    server_hostname=self.host if self._ssl is not None else None,
                ),
                self.connect_timeout,
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
        self,
        method: str,
        path: str,
        headers: Sequence[tuple[str, str]],
        *,
        has_body: bool,
        authorization: str | None = None,
    ) -> tuple[bytes, int | None]:
        """The request head's bytes and the body length it announces (None: none).

        A body without a content-length goes chunked. ``authorization`` is
        added per request, never remembered with the caller's headers.
        """
        if _METHOD.fullmatch(method) is None:
            raise UpstreamRequestError(f"the method {method[:16]!r} cannot be sent")
        if not path.startswith("/") or _UNSAFE_TARGET.search(path) is not None:
            raise UpstreamRequestError(
                "the request path holds a space or a control character: it cannot be sent"
            )
        lines, length = _header_lines(tuple(headers))
        if authorization is not None:
            if _UNSAFE_VALUES.search(authorization) is not None:
                raise UpstreamRequestError(
                    "the agent's own Authorization value holds a control character"
                )
            lines += b"authorization: " + _encode(authorization) + b"\r\n"
        if has_body and length is None:
            lines += b"transfer-encoding: chunked\r\n"
        request_line = f"{method} {self._prefix}{path} HTTP/1.1\r\nhost: {self._authority}\r\n"
        return _encode(request_line) + lines + b"\r\n", length


def check_sendable(headers: Sequence[tuple[str, str]]) -> None:
    """Raise :class:`UpstreamRequestError` unless ``headers`` can be sent as they are.

    For the requests another client sends (HEAD and upgrades go through
    aiohttp): the same rule as this client's, so a request refused here is
    refused there, with the same message, before any connection is opened.
    Every header is checked, those this client would set itself included,
    and nothing is remembered (each upgrade's headers are its own).
    """
    _check_names_and_values([name for name, _ in headers], [value for _, value in headers])


@functools.lru_cache(maxsize=64)
def _header_lines(headers: tuple[tuple[str, str], ...]) -> tuple[bytes, int | None]:
    """The header lines to send for ``headers``, and the content-length among them.

    Remembered: the same callers send the same headers with every request (at
    most 64 blocks, each no larger than the protocol's header limit). The
    agent's own credential is not among them: it is added per request, so a
    rotated token is not kept here.
    """
    lines: list[str] = []
    names: list[str] = []
    values: list[str] = []
    length: int | None = None
    for name, value in headers:
        lower = name.lower()
        if lower in _OWN_HEADERS:
            continue
        if lower == "content-length":
            if length is not None or _DIGITS.fullmatch(value) is None:
                raise UpstreamRequestError("the request needs one content-length of decimal digits")
            length = int(value)
        names.append(name)
        values.append(value)
        lines.append(f"{name}: {value}\r\n")
    _check_names_and_values(names, values)
    return _encode("".join(lines)), length


def _check_names_and_values(names: list[str], values: list[str]) -> None:
    # One check over all names and one over all values: each header checked
    # alone would cost as much as the rest of the head's encoding.
    joined = " ".join(names)
    if names and (_TOKENS.fullmatch(joined) is None or joined.count(" ") != len(names) - 1):
        raise UpstreamRequestError(f"the header name {_bad_name(names)!r} cannot be sent")
    if _UNSAFE_VALUES.search("\t".join(values)) is not None:
        culprit = next(n for n, v in zip(names, values, strict=True) if _UNSAFE_VALUES.search(v))
        raise UpstreamRequestError(
            f"the value of the {culprit} header holds a control character (CR, LF ...): "
            "it cannot be sent"
        )


def _encode(text: str) -> bytes:
    try:
        # UTF-8, as aiohttp sent it; surrogateescape gives back bytes the
        # caller sent that were not UTF-8. Neither can make a CR or LF byte.
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as exc:
        raise UpstreamRequestError("the request head is not valid text") from exc


def _replayable(method: str, has_body: bool, connection: UpstreamConnection) -> bool:
    """Whether a request a stale connection dropped may be sent again (Go's rule).

    Without a body, only if it is idempotent: the API server may have acted on
    it before it closed. With one, only if no byte of the body was taken or
    sent: the server cannot have acted on a request it has not had whole.
    """
    if not has_body:
        return method in ("GET", "OPTIONS")
    return not connection.body_consumed and not connection.body_started


def _bad_name(names: list[str]) -> str:
    return next((name for name in names if re.fullmatch(_NAME_CHARS, name) is None), "")[:64]


class UpstreamResponse:
    """The answer of the API server: head, then its body as it arrives.

    Use as ``with response:``; leaving returns the connection to the pool when
    the answer was read to its clean end, and closes it otherwise (an error,
    cancellation, a body left unread).
    """

    def __init__(self, pool: UpstreamPool, connection: UpstreamConnection) -> None:
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
