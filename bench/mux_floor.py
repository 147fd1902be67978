"""The relay floor with the product's multiplexing layer: py-relay over tunnel_mux.

The topology of :mod:`bench.relay_floor` (``py-relay``), two processes:

- ``near`` (in place of the tunnel server) accepts clients (wrk, curl) over
  TLS on one port and, on a second TLS port, exactly one ``far`` end as an
  aiohttp WebSocket; each client connection becomes one stream on it;
- ``far`` (in place of the agent) dials out to ``near`` with aiohttp's
  ``ws_connect``, as the agent does, and for each new stream opens a plain
  TCP connection to the upstream.

What differs from py-relay is the tunnel between them: the product's own
stack, used as the server and the agent use it. A ``tunnel_mux.Session``
(its reader, writer and timer tasks) over ``tunnel_mux.WebSocketTransport``
drives a sans-I/O ``protocol.Connection`` with the product's default limits
and keepalive: the HELLO handshake, msgpack frames batched into WebSocket
messages, per-stream and per-connection credit returned as data is read. The
WebSocket settings are the server's (``tunnel_server/agents/endpoint.py``) and
the agent's (``tunnel_agent/connector.py``): ``max_msg_size`` from the
limits, no compression, no WebSocket heartbeat (the protocol's PING keeps
the connection alive). Each stream is relayed with ``MuxStream.write`` and
``MuxStream.read``, with backpressure both ways: a socket stops being read
while a write waits for credit, and a stream stops being read while its
socket's write buffer is full (so its credit stops coming back). The far end
runs each stream in the handler task the session starts for it, as the agent
does. Both ends run on uvloop (``tunnel_cli.run_main``) and freeze their
start-up objects out of the garbage collector, as the product does.

What it is not: no authentication (no client certificate, no tokens), no
HTTP parsing (bytes are relayed as they are, in DATA frames, with an empty
header map on OPEN), no policy, no audit, no metrics, no logging per request,
no reconnection. So ``mux-relay`` minus ``py-relay`` is what the multiplexing
layer costs, and ``tunnel`` minus ``mux-relay`` what the application on top
of it costs.

    python -m bench.mux_floor near --listen 127.0.0.1:8443 \\
        --tunnel-listen 127.0.0.1:8444 --cert server.crt --key server.key
    python -m bench.mux_floor far --tunnel 127.0.0.1:8444 --ca ca.crt \\
        --upstream 127.0.0.1:8080

The command lines are those of :mod:`bench.relay_floor`. ``near`` writes one
JSON line to stdout when it listens (``{"listening": PORT, "tunnel": PORT}``)
and one when the far end's handshake is done (``{"tunnel": "connected"}``);
nothing per request. Both exit on SIGTERM or SIGINT; ``far`` also exits
(status 1) when the session ends.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import sys
from collections import deque
from collections.abc import Sequence
from typing import cast

import aiohttp
from aiohttp import web

from protocol import Connection, ErrorCode, Keepalive, Limits, Side, TunnelError, kinds
from tunnel_cli import freeze_startup_objects, run_main
from tunnel_mux import MuxStream, Session, SessionError, SessionHandlers, WebSocketTransport

from .floor_cli import floor_parser, stop_event

__all__ = ["KEEPALIVE", "LIMITS", "STREAM_KIND", "Bridge", "far", "main", "near"]

#: The limits and keepalive both ends announce and keep: the product's defaults
#: (``tunnel_server.config.TunnelSettings``, ``tunnel_agent.config.ConnectSettings``).
LIMITS = Limits()
KEEPALIVE = Keepalive()
#: The kind of every relayed stream: the one the server opens toward the agent for
#: a Kubernetes API request (here its bytes are relayed raw, not as an HTTP head).
STREAM_KIND = kinds.STREAM_HTTP
#: The server's defaults: WebSocket upgrade to HELLO, and the closing handshake.
HANDSHAKE_TIMEOUT = 10.0
CLOSE_TIMEOUT = 2.0
#: The agent's default for TCP, TLS and the WebSocket upgrade together.
CONNECT_TIMEOUT = 30.0
#: Bytes read from a socket and held for its stream before the socket stops being read
#: (it stops at once while a write waits for credit; this bounds the rest).
HELD_HIGH_WATER = 256 * 1024

_CANCEL = ErrorCode.CANCEL


def _report(task: asyncio.Task[None]) -> None:
    """A relay task's supervisor: a failure the relay did not expect is said, loudly."""
    if not task.cancelled() and (error := task.exception()) is not None:
        print(f"mux_floor: {task.get_name()} failed: {error!r}", file=sys.stderr, flush=True)


class Bridge(asyncio.Protocol):
    """One socket (a client at the near end, the upstream at the far end) and its stream.

    :meth:`upload` takes what the socket sends to the stream and ends the
    stream when the socket has nothing more; :meth:`download` takes what the
    stream brings to the socket and closes the socket at the stream's end.
    Either aborts the socket if the stream fails.
    """

    def __init__(self, stream: MuxStream | None) -> None:
        self.stream = stream
        self.transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        #: What the socket sent that the stream has not taken yet.
        self._held: deque[bytes] = deque()
        self._held_size = 0
        #: The socket sent its end, or is gone.
        self._ended = False
        self._lost = False
        self._wakeup: asyncio.Future[None] | None = None
        #: The uploader is suspended in ``stream.write``: waiting for credit.
        self._writing = False
        self._reading_paused = False
        self._writing_paused = False
        self._drain_waiter: asyncio.Future[None] | None = None

    # ------------------------------------------------------------ asyncio

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A cast, not an isinstance check: uvloop's transports are not subclasses.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._held.append(data)
        self._held_size += len(data)
        if self._writing or self._held_size > HELD_HIGH_WATER:
            self._pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        return False  # close: no half-closed connections here (TLS has none anyway)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = self._ended = True
        self._wake()
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionResetError("the socket is gone"))

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # ----------------------------------------------------------- the relay

    async def upload(self) -> None:
        """Socket to stream, until the socket ends; then :meth:`socket_ended`."""
        stream = self.stream
        assert stream is not None
        held = self._held
        try:
            while True:
                if held:
                    data = held.popleft() if len(held) == 1 else b"".join(held)
                    held.clear()
                    self._held_size = 0
                    self._writing = True
                    try:
                        await stream.write(data)
                    finally:
                        self._writing = False
                    self._resume_reading()
                elif self._ended:
                    break
                else:
                    self._wakeup = self._loop.create_future()
                    try:
                        await self._wakeup
                    finally:
                        self._wakeup = None
        except SessionError:
            self._abort()  # the stream was reset or the session ended
            return
        self.socket_ended()

    def socket_ended(self) -> None:
        """The socket has sent all it will and the stream has it: end the stream."""
        assert self.stream is not None
        self.stream.end()

    async def download(self) -> None:
        """Stream to socket, until the stream's end; then close the socket once written."""
        stream, transport = self.stream, self.transport
        assert stream is not None
        assert transport is not None
        try:
            while data := await stream.read():
                if self._lost:
                    return
                transport.write(data)
                if self._writing_paused:
                    await self._drain()
        except SessionError:
            self._abort()
            return
        except ConnectionError:
            return  # the socket went away while its buffer was full
        transport.close()

    # ------------------------------------------------------------ helpers

    def _wake(self) -> None:
        waiter = self._wakeup
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _drain(self) -> None:
        waiter = self._drain_waiter = self._loop.create_future()
        try:
            await waiter
        finally:
            self._drain_waiter = None

    def _pause_reading(self) -> None:
        if not self._reading_paused and not self._lost and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._reading_paused and not self._lost and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()

    def _abort(self) -> None:
        if self.transport is not None and not self._lost:
            self.transport.abort()


# ---------------------------------------------------------------------- near


class _Refused(asyncio.Protocol):
    """A client near cannot serve (no far end, or no stream to be had): closed at once."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cast(asyncio.Transport, transport).abort()


class _Near:
    """The near end's state: the far end's session, and the clients relayed over it."""

    def __init__(self) -> None:
        self.session: Session | None = None
        #: A far end is connected, or being connected: any other is refused.
        self.busy = False
        self.clients: set[_Client] = set()

    def client(self) -> asyncio.Protocol:
        return _Refused() if self.session is None else _Client(self)


class _Client(Bridge):
    """A client connection at the near end: one stream, opened when its TLS is up."""

    def __init__(self, near: _Near) -> None:
        super().__init__(None)
        self._near = near
        self._tasks: tuple[asyncio.Task[None], ...] = ()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        session = self._near.session
        try:
            if session is None:
                raise SessionError("the far end has gone")
            self.stream = session.open_stream(STREAM_KIND)
        except TunnelError as exc:  # gone, going away, at the far end's stream limit
            print(f"mux_floor near: client refused: {exc}", file=sys.stderr, flush=True)
            self.transport = None
            cast(asyncio.Transport, transport).abort()
            return
        self._near.clients.add(self)
        sid = self.stream.id
        self._tasks = (
            self._loop.create_task(self.upload(), name=f"stream {sid} upload"),
            self._loop.create_task(self.download(), name=f"stream {sid} download"),
        )
        for task in self._tasks:
            task.add_done_callback(_report)

    def socket_ended(self) -> None:
        pass  # connection_lost decides: see there

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._near.clients.discard(self)
        stream = self.stream
        if stream is not None and stream.error is None:
            # The client is gone: if the far end had ended its side (the upstream
            # closed) and all of it came, the stream ends cleanly; otherwise what
            # is in flight has nobody to go to, and the far end stops now.
            if stream.at_eof:
                stream.end()
            else:
                stream.reset(_CANCEL, "the client left")
        for task in self._tasks:
            task.cancel()


_NEAR: web.AppKey[_Near] = web.AppKey("mux_floor_near", _Near)


async def _far_end(request: web.Request) -> web.StreamResponse:
    """The far end's WebSocket: a server-side session, as ``tunnel_server.agents.endpoint``."""
    near = request.app[_NEAR]
    if near.busy:
        raise web.HTTPConflict(text="a far end is connected already\n")
    near.busy = True
    try:
        websocket = web.WebSocketResponse(
            timeout=CLOSE_TIMEOUT,
            max_msg_size=LIMITS.message_limit,
            compress=False,
            autoping=True,
            heartbeat=None,  # the protocol's own PING keeps the socket alive
        )
        await websocket.prepare(request)
        session = Session(
            WebSocketTransport(websocket),
            Connection(Side.SERVER, LIMITS, keepalive=KEEPALIVE),
            handlers=SessionHandlers(),  # streams the far end opens are refused
            label="near",
        )
        run = asyncio.create_task(session.run(), name="near session")
        try:
            await asyncio.wait_for(session.wait_ready(), HANDSHAKE_TIMEOUT)
        except (TimeoutError, SessionError) as exc:
            print(f"mux_floor near: no handshake: {exc}", file=sys.stderr, flush=True)
            await session.close()
            await run
            return websocket
        near.session = session
        print(json.dumps({"tunnel": "connected"}), flush=True)
        try:
            await run
        finally:
            near.session = None
            print(
                f"mux_floor near: the far end left: {session.close_reason}",
                file=sys.stderr,
                flush=True,
            )
        return websocket
    finally:
        near.busy = False


def _server_context(cert: str, key: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context


async def near(listen: tuple[str, int], tunnel_listen: tuple[str, int], cert: str, key: str) -> int:
    """Serve clients over the one far end until SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    stop = stop_event()
    clients = _server_context(cert, key)
    clients.set_alpn_protocols(["http/1.1"])
    state = _Near()
    app = web.Application()
    app[_NEAR] = state
    app.router.add_get(kinds.PATH_AGENT_CONNECT, _far_end)
    # As tunnel_server.app runs its runner: no access log; a peer that goes away
    # cancels its handler.
    runner = web.AppRunner(
        app, handle_signals=False, access_log=None, shutdown_timeout=1.0, handler_cancellation=True
    )
    await runner.setup()
    site = web.TCPSite(runner, *tunnel_listen, ssl_context=_server_context(cert, key))
    await site.start()
    server = await loop.create_server(state.client, *listen, ssl=clients, backlog=2048)
    port = server.sockets[0].getsockname()[1]
    tunnel_port = runner.addresses[0][1]
    freeze_startup_objects()
    print(json.dumps({"listening": port, "tunnel": tunnel_port}), flush=True)
    await stop.wait()
    server.close()
    for client in list(state.clients):
        if client.transport is not None:
            client.transport.abort()
    if state.session is not None:
        await state.session.close()
    await runner.cleanup()
    return 0


# ----------------------------------------------------------------------- far


def _relay_to(upstream: tuple[str, int]) -> SessionHandlers:
    """The far end's handler of each stream: relay it to a new connection to ``upstream``."""
    host, port = upstream

    async def on_stream(stream: MuxStream) -> None:
        if stream.kind != STREAM_KIND:
            stream.reset(ErrorCode.REFUSED_STREAM, f"the far end takes no {stream.kind} streams")
            return
        loop = asyncio.get_running_loop()
        bridge = Bridge(stream)
        try:
            await loop.create_connection(lambda: bridge, host, port)
        except OSError as exc:
            print(f"mux_floor far: upstream: {exc}", file=sys.stderr, flush=True)
            stream.reset(_CANCEL, "the upstream is unreachable")
            return
        # This task (the session's, one per stream) uploads; the download is its own.
        download = loop.create_task(bridge.download(), name=f"stream {stream.id} download")
        download.add_done_callback(_report)
        try:
            await bridge.upload()
        finally:
            # The upstream is gone and the stream ended, or the near end reset the
            # stream (the session cancels this task then): nothing more either way.
            download.cancel()
            await asyncio.gather(download, return_exceptions=True)
            if bridge.transport is not None:
                bridge.transport.abort()

    return SessionHandlers(on_stream=on_stream)


async def far(tunnel: tuple[str, int], ca: str, upstream: tuple[str, int]) -> int:
    """Relay the near end's streams to ``upstream`` until the session ends, or a signal."""
    stop = stop_event()
    context = ssl.create_default_context(cafile=ca)
    host, port = tunnel
    url = f"wss://{host}:{port}{kinds.PATH_AGENT_CONNECT}"
    async with aiohttp.ClientSession() as http:
        try:
            websocket = await asyncio.wait_for(
                http.ws_connect(
                    url,
                    ssl=context,
                    max_msg_size=LIMITS.message_limit,
                    autoping=True,
                    heartbeat=None,
                    compress=0,
                ),
                CONNECT_TIMEOUT,
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            print(f"mux_floor far: cannot reach {url}: {exc}", file=sys.stderr, flush=True)
            return 1
        session = Session(
            WebSocketTransport(websocket),
            Connection(Side.CLIENT, LIMITS, keepalive=KEEPALIVE),
            handlers=_relay_to(upstream),
            label="far",
        )
        run = asyncio.create_task(session.run(), name="far session")
        stopped = asyncio.create_task(stop.wait(), name="far stop")
        freeze_startup_objects()
        await asyncio.wait({run, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if run.done():
            print(
                f"mux_floor far: the session ended: {session.close_reason}",
                file=sys.stderr,
                flush=True,
            )
            await run
            return 1
        await session.close()
        await run
        return 0


# ---------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    args = floor_parser("python -m bench.mux_floor", __doc__).parse_args(argv)
    if args.role == "near":
        return run_main(near(args.listen, args.tunnel_listen, args.cert, args.key), "uvloop")
    return run_main(far(args.tunnel, args.ca, args.upstream), "uvloop")


if __name__ == "__main__":
    sys.exit(main())
