"""A small HTTP CONNECT proxy on loopback, for the agent's proxy tests.

It answers ``CONNECT host:port HTTP/1.1`` (the request head bounded), checks
``Proxy-Authorization: Basic`` when it has credentials, and then either pipes
bytes both ways to the target or, when given a TLS context, terminates TLS
itself as an intercepting ("inspecting") corporate proxy would. It records
what it saw so tests can assert on it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta

from tunnel_pki.ca import CertificateAuthority
from tunnel_pki.tls import load_cert_chain

__all__ = ["ConnectProxy", "interception_context", "running_proxy"]

#: The longest request head (request line and headers) the proxy reads.
MAX_HEAD = 16 * 1024

_PROXY_AUTH_REQUIRED = (
    b"HTTP/1.1 407 Proxy Authentication Required\r\n"
    b'Proxy-Authenticate: Basic realm="test proxy"\r\n'
    b"Content-Length: 0\r\nConnection: close\r\n\r\n"
)
_BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_NOT_CONNECT = b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_BAD_GATEWAY = b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_ESTABLISHED = b"HTTP/1.1 200 Connection Established\r\n\r\n"


@dataclass
class ConnectProxy:
    """The proxy's settings and what it saw.

    ``credentials`` is the (user, password) it demands, or None for an open
    proxy. ``intercept`` is a server TLS context it terminates TLS with after
    CONNECT instead of piping to the target (a TLS-inspecting proxy).
    """

    credentials: tuple[str, str] | None = None
    intercept: ssl.SSLContext | None = None
    port: int = 0
    #: ``host:port`` of each CONNECT it accepted.
    connects: list[str] = field(default_factory=list)
    #: The (user, password) each CONNECT carried, or None when it carried none.
    authorizations: list[tuple[str, str] | None] = field(default_factory=list)
    #: CONNECTs refused with 407.
    refused: int = 0
    #: TLS handshakes the intercepting proxy attempted, and why each failed.
    intercepted: int = 0
    interception_failures: list[str] = field(default_factory=list)
    _server: asyncio.Server | None = field(default=None, repr=False)
    _pipes: list[_Pipe] = field(default_factory=list, repr=False)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set, repr=False)

    def url(self, user: str | None = None, password: str | None = None) -> str:
        """The proxy URL for HTTPS_PROXY, with ``user:password@`` when given."""
        userinfo = f"{user}:{password}@" if user is not None else ""
        return f"http://{userinfo}127.0.0.1:{self.port}"

    def blackhole(self) -> int:
        """The tunnels open now go dead without a word; returns how many.

        Their bytes are read and dropped both ways, and neither end is closed
        or told, as when a NAT or firewall forgets a flow. Tunnels opened
        after this pass bytes as usual.
        """
        for pipe in self._pipes:
            pipe.dropping = True
        return len(self._pipes)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0, limit=MAX_HEAD)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        """Stop listening and drop every connection still open."""
        if self._server is not None:
            self._server.close()
        # Tunnels still open end as their sockets go (a cancelled connection
        # task would be logged as an error by asyncio's start_server).
        for pipe in self._pipes:
            for stream in pipe.streams:
                stream.transport.abort()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        # Every stream this connection opens, closed however it ends (even cancelled).
        streams = [writer]
        try:
            await self._handle(reader, writer, streams)
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # a peer went away mid-exchange; nothing to answer
        finally:
            self._tasks.discard(task)
            for stream in streams:
                stream.close()
                with contextlib.suppress(OSError, ssl.SSLError):
                    await stream.wait_closed()

    async def _handle(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        streams: list[asyncio.StreamWriter],
    ) -> None:
        """Serve one client connection; add any upstream stream it opens to ``streams``."""
        head = await reader.readuntil(b"\r\n\r\n")
        try:
            request_line, *header_lines = head.decode("latin-1").split("\r\n")
            method, target, _version = request_line.split(" ")
            host, _, port_text = target.rpartition(":")
            port = int(port_text)
        except ValueError:
            writer.write(_BAD_REQUEST)
            return
        if method != "CONNECT":
            writer.write(_NOT_CONNECT)
            return
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            if name:
                headers[name.strip().lower()] = value.strip()
        offered = _basic_credentials(headers.get("proxy-authorization"))
        self.authorizations.append(offered)
        if self.credentials is not None and offered != self.credentials:
            self.refused += 1
            writer.write(_PROXY_AUTH_REQUIRED)
            return
        self.connects.append(f"{host}:{port}")
        if self.intercept is not None:
            writer.write(_ESTABLISHED)
            await writer.drain()
            await self._intercept(writer, self.intercept)
            return
        try:
            upstream_reader, upstream = await asyncio.open_connection(host.strip("[]"), port)
        except OSError:
            writer.write(_BAD_GATEWAY)
            return
        streams.append(upstream)
        writer.write(_ESTABLISHED)
        await writer.drain()
        pipe = _Pipe(streams=[writer, upstream])
        self._pipes.append(pipe)
        try:
            await asyncio.gather(
                _pump(reader, upstream, pipe), _pump(upstream_reader, writer, pipe)
            )
        finally:
            self._pipes.remove(pipe)

    async def _intercept(self, writer: asyncio.StreamWriter, context: ssl.SSLContext) -> None:
        # A TLS-inspecting proxy presents its own certificate for the target;
        # a client that pins the real CA aborts the handshake.
        self.intercepted += 1
        try:
            await writer.start_tls(context)
        except (OSError, ssl.SSLError) as exc:
            self.interception_failures.append(repr(exc))


@dataclass
class _Pipe:
    """One tunnel's two pumps; ``dropping`` once it is made a black hole."""

    streams: list[asyncio.StreamWriter]
    dropping: bool = False


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter, pipe: _Pipe) -> None:
    """Copy bytes until end of file, then pass the end of file on (unless dropping)."""
    try:
        while data := await source.read(64 * 1024):
            if pipe.dropping:
                continue
            sink.write(data)
            await sink.drain()
        if sink.can_write_eof() and not pipe.dropping:
            sink.write_eof()
    except OSError:
        sink.close()


def _basic_credentials(header: str | None) -> tuple[str, str] | None:
    """The (user, password) of a ``Basic`` Proxy-Authorization header, or None."""
    if header is None:
        return None
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else None


def interception_context(host: str = "127.0.0.1") -> ssl.SSLContext:
    """A server TLS context for ``host`` from a CA of its own (not the tunnel's)."""
    other_ca = CertificateAuthority.create("corporate inspection CA")
    issued = other_ca.issue_server_certificate([host], timedelta(days=1))
    assert issued.key_pem is not None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    load_cert_chain(context, issued.cert_pem + other_ca.cert_pem, issued.key_pem)
    return context


@contextlib.asynccontextmanager
async def running_proxy(
    credentials: tuple[str, str] | None = None, intercept: ssl.SSLContext | None = None
) -> AsyncIterator[ConnectProxy]:
    """Run a CONNECT proxy on 127.0.0.1 (any free port) for the block."""
    proxy = ConnectProxy(credentials=credentials, intercept=intercept)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()
