"""The floor under any Python relay: the least one can do over the tunnel's hops.

Two processes with the topology of the tunnel and of ``ssh -R``:

- ``near`` (in place of the tunnel server) accepts clients (wrk, curl) over
  TLS on one port, and over TLS on a second port accepts exactly one ``far``
  end; each client connection becomes a stream on that one connection;
- ``far`` (in place of the agent) dials out to ``near`` over TLS, as the agent
  does, and for each new stream opens a plain TCP connection to the upstream.

Both run on uvloop, as the tunnel does (``tunnel_cli/eventloop.py``), with
``asyncio.Protocol`` callbacks rather than streams. A frame on the tunnel is
a 9-byte header (type: OPEN, DATA or CLOSE; stream id; payload length) and
the payload. DATA payloads are written to the stream's socket as they arrive,
piece by piece, never reassembled; what a turn of the event loop sends to the
tunnel goes out in one ``transport.write`` (one batch of TLS records rather
than one per frame). TCP_NODELAY is on for every connection: uvloop sets it on
each TCP transport it makes (``TCPTransport.new``).

What it is not: no authentication (the far end presents no certificate and
proves nothing), no HTTP parsing (bytes are relayed as they are), no flow
control per stream, no audit, no logging per request, no reconnection. So it
is the least a Python relay can do per request over these hops; what the
tunnel costs beyond it is what its application logic costs.

Backpressure is coarse but bounded: when the tunnel's write buffer passes its
high-water mark, every stream stops reading its socket until it drains; when
any stream's socket cannot take more, the tunnel stops reading until it can.
One slow client thus holds up every stream. That is fine here: the floor is
there to measure the cost per request and per byte, and a 100 MiB download
must not grow memory without bound; head-of-line blocking between streams,
which per-stream credit exists to avoid, is not what this route measures.

    python -m bench.relay_floor near --listen 127.0.0.1:8443 \\
        --tunnel-listen 127.0.0.1:8444 --cert server.crt --key server.key
    python -m bench.relay_floor far --tunnel 127.0.0.1:8444 --ca ca.crt \\
        --upstream 127.0.0.1:8080

``near`` writes one JSON line to stdout when it listens (``{"listening": PORT,
"tunnel": PORT}``) and one when the far end has connected (``{"tunnel":
"connected"}``); nothing per request. Both exit on SIGTERM or SIGINT; ``far``
also exits (status 1) when the tunnel closes.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import struct
import sys
from collections.abc import Sequence
from typing import cast

import uvloop

from .floor_cli import floor_parser, stop_event

__all__ = ["CLOSE", "DATA", "HEADER", "OPEN", "Mux", "Stream", "main"]

#: A frame's header: type (u8), stream id (u32), payload length (u32), network order.
HEADER = struct.Struct("!BII")
OPEN, DATA, CLOSE = 1, 2, 3
_HEADER_SIZE = HEADER.size
#: The tunnel's write buffer: past this, streams stop reading (uvloop's default is 64 KiB;
#: more lets bulk run with fewer pauses, and still bounds what one process holds).
_TUNNEL_HIGH_WATER = 1024 * 1024
_Payload = bytes | memoryview


class Stream(asyncio.Protocol):
    """One relayed connection: a client at the near end, the upstream at the far end."""

    __slots__ = ("mux", "peer_closed", "pending", "sid", "transport")

    def __init__(self, mux: Mux, sid: int) -> None:
        self.mux = mux
        self.sid = sid
        self.transport: asyncio.Transport | None = None
        #: What came for it before its connection was made (far end only).
        self.pending: list[bytes] = []
        #: The other end closed it: do not send CLOSE back.
        self.peer_closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports have asyncio.Transport's methods but do not subclass it.
        self.transport = transport = cast(asyncio.Transport, transport)
        self.mux.attach(self)
        if self.peer_closed:
            transport.close()
            return
        if self.pending:
            transport.write(b"".join(self.pending))
            self.pending.clear()
        if self.mux.writing_paused:
            transport.pause_reading()

    def data_received(self, data: bytes) -> None:
        self.mux.send(DATA, self.sid, data)

    def eof_received(self) -> bool:
        return False  # close: no half-closed streams here

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.mux.detach(self)

    def pause_writing(self) -> None:
        self.mux.stall(self.sid)

    def resume_writing(self) -> None:
        self.mux.unstall(self.sid)

    def deliver(self, data: _Payload) -> None:
        """Write a piece of a DATA payload to this stream's socket."""
        transport = self.transport
        if transport is None:
            if not self.peer_closed:
                self.pending.append(bytes(data))
        elif not transport.is_closing():  # closing: the CLOSE it will send is on its way
            transport.write(data)

    def close_by_peer(self) -> None:
        self.peer_closed = True
        if self.transport is not None:
            self.transport.close()  # after what is buffered has been written


class Mux(asyncio.Protocol):
    """The one tunnel connection, at either end: frames out in batches, frames in as they come."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, Stream] = {}
        #: The tunnel's write buffer is over its high-water mark: streams do not read.
        self.writing_paused = False
        self._loop = asyncio.get_running_loop()
        self._out: list[_Payload] = []
        self._flush_due = False
        #: Streams whose socket cannot take more: the tunnel does not read while any is.
        self._stalled: set[int] = set()
        # The incoming frame: a header not yet whole; the payload bytes still to come.
        self._head = bytearray()
        self._left = 0
        self._sink: Stream | None = None

    # ------------------------------------------------------------ out

    def send(self, kind: int, sid: int, payload: _Payload = b"") -> None:
        """Queue a frame; the whole turn's frames are written once, at its end."""
        self._out.append(HEADER.pack(kind, sid, len(payload)))
        if payload:
            self._out.append(payload)
        if not self._flush_due:
            self._flush_due = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_due = False
        if self.transport is not None:
            self.transport.write(b"".join(self._out))
        self._out.clear()

    # ------------------------------------------------------------- in

    def data_received(self, data: bytes) -> None:
        view = memoryview(data)
        end = len(data)
        position = 0
        while position < end:
            if self._left:
                size = min(self._left, end - position)
                if self._sink is not None:
                    self._sink.deliver(view[position : position + size])
                position += size
                self._left -= size
                continue
            if self._head or end - position < _HEADER_SIZE:
                size = min(_HEADER_SIZE - len(self._head), end - position)
                self._head += view[position : position + size]
                position += size
                if len(self._head) < _HEADER_SIZE:
                    return
                kind, sid, length = HEADER.unpack(self._head)
                self._head.clear()
            else:
                kind, sid, length = HEADER.unpack_from(data, position)
                position += _HEADER_SIZE
            if kind == DATA:
                self._sink = self.streams.get(sid)  # None: closed here already; drop it
                self._left = length
            elif kind == CLOSE and length == 0:
                stream = self.streams.pop(sid, None)
                if stream is not None:
                    stream.close_by_peer()
            elif kind == OPEN and length == 0:
                self.opened(sid)
            else:
                self._fail(f"a frame of type {kind} with {length} bytes is not in this protocol")
                return

    def opened(self, sid: int) -> None:
        """The other end opened stream ``sid`` (only the near end opens streams)."""
        self._fail("the near end does not accept streams")

    def _fail(self, why: str) -> None:
        print(f"relay_floor: {why}; closing the tunnel", file=sys.stderr, flush=True)
        if self.transport is not None:
            self.transport.abort()

    # -------------------------------------------------------- streams

    def attach(self, stream: Stream) -> None:
        """``stream``'s connection is made: it is a stream of this tunnel (if still open)."""
        if self.transport is None:
            stream.peer_closed = True  # the tunnel is gone: nothing to relay to
        elif stream.sid not in self.streams and not stream.peer_closed:
            self.streams[stream.sid] = stream
            self.send(OPEN, stream.sid)

    def detach(self, stream: Stream) -> None:
        """``stream``'s connection is gone; tell the other end unless it said so first."""
        if self.streams.get(stream.sid) is stream:
            del self.streams[stream.sid]
        if self._sink is stream:
            self._sink = None  # the rest of the frame in hand is for nobody
        if not stream.peer_closed and self.transport is not None:
            self.send(CLOSE, stream.sid)
        self.unstall(stream.sid)

    def stall(self, sid: int) -> None:
        self._stalled.add(sid)
        if len(self._stalled) == 1 and self.transport is not None:
            self.transport.pause_reading()

    def unstall(self, sid: int) -> None:
        if sid in self._stalled:
            self._stalled.discard(sid)
            if not self._stalled and self.transport is not None:
                self.transport.resume_reading()

    # ------------------------------------------------- the connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)
        transport.set_write_buffer_limits(high=_TUNNEL_HIGH_WATER)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._out.clear()
        streams, self.streams = list(self.streams.values()), {}
        for stream in streams:
            stream.peer_closed = True
            if stream.transport is not None:
                stream.transport.abort()

    def pause_writing(self) -> None:
        self.writing_paused = True
        for stream in self.streams.values():
            if stream.transport is not None:
                stream.transport.pause_reading()

    def resume_writing(self) -> None:
        self.writing_paused = False
        for stream in self.streams.values():
            if stream.transport is not None:
                stream.transport.resume_reading()


class _Refused(asyncio.Protocol):
    """A connection near cannot serve (no far end yet, or a second one): closed at once."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cast(asyncio.Transport, transport).abort()


class _NearTunnel(Mux):
    def __init__(self, near: _Near) -> None:
        super().__init__()
        self.near = near

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.near.tunnel is not None:
            cast(asyncio.Transport, transport).abort()  # exactly one far end
            return
        super().connection_made(transport)
        self.near.tunnel = self
        print(json.dumps({"tunnel": "connected"}), flush=True)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.near.tunnel is self:
            self.near.tunnel = None
            print("relay_floor near: the far end left", file=sys.stderr, flush=True)
        super().connection_lost(exc)


class _Near:
    """The near end's state: the one tunnel, and the stream ids it has handed out."""

    def __init__(self) -> None:
        self.tunnel: Mux | None = None
        self._next_sid = 0

    def client(self) -> asyncio.Protocol:
        if self.tunnel is None:
            return _Refused()
        self._next_sid = (self._next_sid + 1) & 0xFFFFFFFF
        return Stream(self.tunnel, self._next_sid)

    def far_end(self) -> asyncio.Protocol:
        return _NearTunnel(self) if self.tunnel is None else _Refused()


class _FarTunnel(Mux):
    def __init__(self, upstream: tuple[str, int], stop: asyncio.Event) -> None:
        super().__init__()
        self.upstream = upstream
        self.stop = stop
        self._connecting: set[asyncio.Task[None]] = set()

    def opened(self, sid: int) -> None:
        stream = Stream(self, sid)
        self.streams[sid] = stream  # DATA may come before the upstream answers: held
        task = self._loop.create_task(self._connect(stream))
        self._connecting.add(task)
        task.add_done_callback(self._connecting.discard)

    async def _connect(self, stream: Stream) -> None:
        host, port = self.upstream
        try:
            await self._loop.create_connection(lambda: stream, host, port)
        except OSError as exc:
            print(f"relay_floor far: upstream: {exc}", file=sys.stderr, flush=True)
            stream.pending.clear()
            self.detach(stream)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        for task in self._connecting:
            task.cancel()
        self.stop.set()


async def near(listen: tuple[str, int], tunnel_listen: tuple[str, int], cert: str, key: str) -> int:
    """Serve clients over the one far end until SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    stop = stop_event()
    clients = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    clients.load_cert_chain(cert, key)
    clients.set_alpn_protocols(["http/1.1"])
    tunnel = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tunnel.load_cert_chain(cert, key)
    state = _Near()
    servers = [
        await loop.create_server(state.client, *listen, ssl=clients, backlog=2048),
        await loop.create_server(state.far_end, *tunnel_listen, ssl=tunnel),
    ]
    ports = [server.sockets[0].getsockname()[1] for server in servers]
    print(json.dumps({"listening": ports[0], "tunnel": ports[1]}), flush=True)
    await stop.wait()
    for server in servers:
        server.close()
    if state.tunnel is not None and state.tunnel.transport is not None:
        state.tunnel.transport.abort()
    return 0


async def far(tunnel: tuple[str, int], ca: str, upstream: tuple[str, int]) -> int:
    """Relay the near end's streams to ``upstream`` until the tunnel closes, or a signal."""
    loop = asyncio.get_running_loop()
    stop = stop_event()
    context = ssl.create_default_context(cafile=ca)
    host, port = tunnel
    try:
        _, mux = await loop.create_connection(
            lambda: _FarTunnel(upstream, stop), host, port, ssl=context, server_hostname=host
        )
    except (OSError, ssl.SSLError) as exc:
        print(f"relay_floor far: cannot reach {host}:{port}: {exc}", file=sys.stderr)
        return 1
    await stop.wait()  # a signal, or the tunnel closed
    if mux.transport is None:
        print("relay_floor far: the tunnel closed", file=sys.stderr, flush=True)
        return 1
    mux.transport.abort()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = floor_parser("python -m bench.relay_floor", __doc__).parse_args(argv)
    if args.role == "near":
        return uvloop.run(near(args.listen, args.tunnel_listen, args.cert, args.key))
    return uvloop.run(far(args.tunnel, args.ca, args.upstream))


if __name__ == "__main__":
    sys.exit(main())
