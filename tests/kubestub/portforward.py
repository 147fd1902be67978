"""``pods/portforward``: pod ports carried to real TCP targets, as kubectl 1.32 asks.

Two protocols over one WebSocket upgrade:

- ``SPDY/3.1+portforward.k8s.io`` (what kubectl 1.31+ speaks by default):
  SPDY frames tunnelled in binary messages. Per forwarded connection the
  client opens an error stream and a data stream, both with headers
  ``streamtype``, ``port`` and ``requestid``; the server replies to each,
  connects to the port's target, and relays the data stream both ways. When
  the target closes, the data stream and then the error stream are finished
  (FIN); a failure to connect is written on the error stream, as the kubelet
  writes it. PINGs are echoed.
- ``v4.channel.k8s.io`` / ``portforward.k8s.io`` (the WebSocket channel
  protocol other clients use): ``?ports=P,Q``, channel 2i carries port i's
  data and 2i+1 its errors; each channel first sends the port as two bytes,
  little-endian.

Where a pod port leads is :meth:`ClusterState.port_target` (by default the
stand-in's TCP echo server).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web

from tests.kubestub.exec import upgrade_websocket
from tests.kubestub.spdy import (
    RST_PROTOCOL_ERROR,
    DataFrame,
    GoAway,
    Ping,
    RstStream,
    SpdyConnection,
    SpdyError,
    SynStream,
)
from tests.kubestub.state import ClusterState
from tests.kubestub.status import bad_request

__all__ = ["PORTFORWARD_PROTOCOLS", "serve_portforward"]

logger = logging.getLogger(__name__)

SPDY_TUNNEL = "SPDY/3.1+portforward.k8s.io"
PORTFORWARD_PROTOCOLS = (SPDY_TUNNEL, "v4.channel.k8s.io", "portforward.k8s.io")
"""The port-forward subprotocols served, most preferred first."""

_READ = 32 * 1024
_MAX_PAIRS = 256
_MAX_PENDING = 1024 * 1024
RST_FLOW_CONTROL_ERROR = 7


def _ports(request: web.Request) -> list[int]:
    ports: list[int] = []
    for value in request.query.getall("ports", []):
        for part in value.split(","):
            try:
                port = int(part)
            except ValueError as exc:
                raise bad_request(f"unable to parse '{part}' as a port") from exc
            if not 0 < port < 65536:
                raise bad_request(f"port {port} must be > 0 and < 65536")
            ports.append(port)
    return ports


async def serve_portforward(
    request: web.Request, state: ClusterState, pod: dict[str, Any]
) -> web.StreamResponse:
    """Upgrade and forward ports of ``pod`` until the client leaves."""
    ports = _ports(request)
    offered = request.headers.get("Sec-WebSocket-Protocol", "")
    if SPDY_TUNNEL not in offered and not ports:
        raise bad_request('query parameter "ports" is required')
    socket = await upgrade_websocket(request, state, PORTFORWARD_PROTOCOLS, "port forwarding")
    target = _Targets(state, pod)
    try:
        if socket.ws_protocol == SPDY_TUNNEL:
            await _SpdySession(socket, target).run()
        else:
            await _channel_session(socket, target, ports)
    except ConnectionResetError:
        pass  # The client went away mid-stream: there is no one left to answer.
    finally:
        state.sockets.discard(socket)
        with contextlib.suppress(ConnectionResetError):
            await socket.close()
    return socket


class _Targets:
    """Opens connections to a pod's ports."""

    def __init__(self, state: ClusterState, pod: dict[str, Any]) -> None:
        self.state = state
        self.namespace = pod["metadata"]["namespace"]
        self.name = pod["metadata"]["name"]
        self.uid = pod["metadata"]["uid"]

    async def connect(self, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Connect to where ``port`` leads; raise OSError with the kubelet's message on failure."""
        where = self.state.port_target(self.namespace, self.name, port)
        if where is None:
            raise OSError(self._message(port, "connect: connection refused"))
        try:
            return await asyncio.open_connection(*where)
        except OSError as exc:
            why = os.strerror(exc.errno).lower() if exc.errno else str(exc)
            raise OSError(self._message(port, f"connect: {why}")) from exc

    def _message(self, port: int, why: str) -> str:
        return (
            f"error forwarding port {port} to pod {self.name}, uid {self.uid}: failed to connect "
            f"to localhost:{port} inside namespace of the pod: dial tcp4 127.0.0.1:{port}: {why}"
        )


@dataclass
class _Pair:
    """The two streams of one forwarded connection."""

    port: int
    error: int = 0
    data: int = 0
    writer: asyncio.StreamWriter | None = None
    task: asyncio.Task[None] | None = None
    inbound: list[bytes] = field(default_factory=list)
    inbound_fin: bool = False


class _SpdySession:
    """One port-forward connection: SPDY frames in WebSocket messages."""

    def __init__(self, socket: web.WebSocketResponse, targets: _Targets) -> None:
        self.socket = socket
        self.targets = targets
        self.spdy = SpdyConnection()
        self.pairs: dict[str, _Pair] = {}
        self.by_stream: dict[int, _Pair] = {}
        self.send_lock = asyncio.Lock()
        self.last_stream = 0

    async def flush(self) -> None:
        async with self.send_lock:
            data = self.spdy.data_to_send()
            if data:
                await self.socket.send_bytes(data)

    async def run(self) -> None:
        try:
            async for message in self.socket:
                if message.type != WSMsgType.BINARY:
                    continue
                try:
                    frames = self.spdy.receive_data(message.data)
                except SpdyError as exc:
                    logger.warning("closing port-forward: %s", exc)
                    self.spdy.goaway(self.last_stream, RST_PROTOCOL_ERROR)
                    await self.flush()
                    return
                for frame in frames:
                    if await self.handle(frame):
                        return
                await self.flush()
        finally:
            for pair in self.pairs.values():
                if pair.task is not None:
                    pair.task.cancel()
                if pair.writer is not None:
                    pair.writer.close()

    async def handle(self, frame: object) -> bool:
        """Act on one frame; True when the session is over."""
        if isinstance(frame, SynStream):
            self.last_stream = max(self.last_stream, frame.stream_id)
            await self.open_stream(frame)
        elif isinstance(frame, DataFrame):
            pair = self.by_stream.get(frame.stream_id)
            if pair is not None and frame.stream_id == pair.data:
                await self.to_target(pair, frame.data, frame.fin)
        elif isinstance(frame, RstStream):
            pair = self.by_stream.pop(frame.stream_id, None)
            if pair is not None and pair.writer is not None and frame.stream_id == pair.data:
                pair.writer.close()
        elif isinstance(frame, Ping):
            self.spdy.ping(frame.ping_id)
        elif isinstance(frame, GoAway):
            return True
        return False

    async def open_stream(self, frame: SynStream) -> None:
        kind = frame.header("streamtype")
        request_id = frame.header("requestid") or frame.header("port")
        try:
            port = int(frame.header("port"))
        except ValueError:
            port = 0
        if kind not in ("error", "data") or not 0 < port < 65536:
            self.spdy.rst_stream(frame.stream_id, RST_PROTOCOL_ERROR)
            return
        pair = self.pairs.get(request_id)
        if pair is None:
            if len(self.pairs) >= _MAX_PAIRS:
                self.spdy.rst_stream(frame.stream_id, RST_PROTOCOL_ERROR)
                return
            pair = self.pairs[request_id] = _Pair(port)
        setattr(pair, kind, frame.stream_id)
        self.by_stream[frame.stream_id] = pair
        self.spdy.syn_reply(frame.stream_id)
        if pair.error and pair.data and pair.task is None:
            pair.task = asyncio.create_task(self.forward(request_id, pair))
            pair.task.add_done_callback(_report)

    async def to_target(self, pair: _Pair, data: bytes, fin: bool) -> None:
        if pair.writer is None:
            # Not connected yet: keep it (bounded) for when the connection is up.
            if sum(map(len, pair.inbound)) + len(data) > _MAX_PENDING:
                self.spdy.rst_stream(pair.data, RST_FLOW_CONTROL_ERROR)
                return
            pair.inbound.append(data)
            pair.inbound_fin = pair.inbound_fin or fin
            return
        if data:
            pair.writer.write(data)
            await pair.writer.drain()
        if fin and pair.writer.can_write_eof():
            pair.writer.write_eof()

    async def forward(self, request_id: str, pair: _Pair) -> None:
        """Connect to the pod port and copy the target's bytes to the data stream."""
        try:
            reader, writer = await self.targets.connect(pair.port)
        except OSError as exc:
            self.spdy.data(pair.error, str(exc).encode(), fin=True)
            self.spdy.data(pair.data, b"", fin=True)
            await self.flush()
            return
        pair.writer = writer
        try:
            pending, pair.inbound = pair.inbound, []
            for data in pending:
                writer.write(data)
            if pair.inbound_fin and writer.can_write_eof():
                writer.write_eof()
            await writer.drain()
            while data := await reader.read(_READ):
                self.spdy.data(pair.data, data)
                await self.flush()
            self.spdy.data(pair.data, b"", fin=True)
            self.spdy.data(pair.error, b"", fin=True)
            await self.flush()
        except (ConnectionError, OSError):
            self.spdy.data(pair.data, b"", fin=True)
            self.spdy.data(pair.error, b"", fin=True)
            with contextlib.suppress(ConnectionError):
                await self.flush()
        finally:
            writer.close()
            self.pairs.pop(request_id, None)


def _report(task: asyncio.Task[None]) -> None:
    """Log a forwarding task that failed unexpectedly (they are not awaited one by one)."""
    if not task.cancelled() and task.exception() is not None:
        logger.error("port-forward connection failed", exc_info=task.exception())


async def _channel_session(
    socket: web.WebSocketResponse, targets: _Targets, ports: list[int]
) -> None:
    """The WebSocket channel protocol: one connection per requested port."""
    connections: list[tuple[asyncio.StreamReader, asyncio.StreamWriter] | None] = []
    for index, port in enumerate(ports):
        prefix = struct.pack("<H", port)
        await socket.send_bytes(bytes([2 * index]) + prefix)
        await socket.send_bytes(bytes([2 * index + 1]) + prefix)
        try:
            connections.append(await targets.connect(port))
        except OSError as exc:
            await socket.send_bytes(bytes([2 * index + 1]) + str(exc).encode())
            connections.append(None)

    async def pump(index: int, reader: asyncio.StreamReader) -> None:
        while data := await reader.read(_READ):
            await socket.send_bytes(bytes([2 * index]) + data)
        await socket.close()

    pumps = [
        asyncio.create_task(pump(index, connection[0]))
        for index, connection in enumerate(connections)
        if connection is not None
    ]
    try:
        async for message in socket:
            if message.type != WSMsgType.BINARY or not message.data:
                continue
            channel = message.data[0]
            if channel % 2 or channel // 2 >= len(connections):
                continue
            connection = connections[channel // 2]
            if connection is not None:
                connection[1].write(message.data[1:])
                await connection[1].drain()
    finally:
        for task in pumps:
            task.cancel()
        for connection in connections:
            if connection is not None:
                connection[1].close()
