"""The proxy benchmark's upstream: a small, fast HTTP/1.1 server standing in for an API server.

It runs in its own process (``python -m bench.proxy_upstream``), on plain HTTP
and, with ``--cert``/``--key``, also on TLS, and serves:

- ``GET /api/v1/namespaces/default/pods/bench``: a fixed Pod of about 500 bytes (JSON);
- ``GET /api/v1/namespaces/default/pods/bench/log?size=N``: N bytes (default
  100 MiB), with Content-Length, paced by the transport's flow control;
- ``GET /api/v1/namespaces/default/pods?watch=true``: a chunked response that
  stays open; each ``POST /control/emit`` writes one watch event (a line of
  JSON) to every open watch and answers how many it reached;
- ``GET /control/stats``: how many watches are open now, and how many bulk bytes
  it has written so far.

It is a bare ``asyncio.Protocol`` rather than aiohttp so that the upstream
costs as little CPU as possible: the machine is shared by the client, the
relays and the upstream, and every path measured goes through this same
upstream. It is not a general HTTP server: GET and POST with Content-Length
bodies only, keep-alive, no pipelining guarantees beyond order.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import ssl
import sys
import time
from collections.abc import Sequence

__all__ = ["BULK_PATH", "EVENT", "POD", "POD_PATH", "WATCH_PATH", "main"]

POD_PATH = "/api/v1/namespaces/default/pods/bench"
BULK_PATH = POD_PATH + "/log"
WATCH_PATH = "/api/v1/namespaces/default/pods?watch=true"
_PODS = "/api/v1/namespaces/default/pods"
MIB = 1024 * 1024
DEFAULT_BULK = 100 * MIB
_MAX_BULK = 16 * 1024 * MIB
_MAX_HEAD = 64 * 1024
_MAX_BODY = 1 * MIB
_CHUNK = 1 * MIB
_ZEROS = bytes(_CHUNK)


def _pod() -> bytes:
    pod = {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": "bench",
            "namespace": "default",
            "uid": "6b1c2a9e-58c4-4e43-9d0e-8f7f3b2f6a10",
            "resourceVersion": "123456",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"app": "bench", "tier": "backend"},
            "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-01-01T00:00:00Z"},
        },
        "spec": {
            "containers": [{"name": "app", "image": "registry.example/app:1.0", "ports": []}],
            "nodeName": "node-1",
            "restartPolicy": "Always",
        },
        "status": {"phase": "Running", "podIP": "10.0.0.7", "hostIP": "192.168.1.10"},
    }
    return json.dumps(pod, separators=(",", ":")).encode()


POD = _pod()
EVENT = b'{"type":"MODIFIED","object":' + POD + b"}\n"
_POD_RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    + f"Content-Length: {len(POD)}\r\n\r\n".encode()
    + POD
)
_EVENT_CHUNK = f"{len(EVENT):x}\r\n".encode() + EVENT + b"\r\n"
_WATCH_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
)


class _State:
    """What all connections share: the open watches."""

    def __init__(self) -> None:
        self.watchers: set[_Http] = set()
        self.bulk_bytes = 0


class _Http(asyncio.Protocol):
    """One client connection."""

    def __init__(self, state: _State) -> None:
        self.state = state
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.paused = False
        #: Bytes of a bulk body still to send; requests after it wait.
        self.bulk_left = 0
        self.watching = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=4 * MIB)

    def connection_lost(self, exc: Exception | None) -> None:
        self.state.watchers.discard(self)
        self.transport = None

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._pump()
        self._serve()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._serve()

    def _serve(self) -> None:
        while self.transport is not None and not self.watching and self.bulk_left == 0:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > _MAX_HEAD:
                    self._fail(b"431 Request Header Fields Too Large")
                return
            head = bytes(self.buffer[:end]).decode("latin-1")
            request_line, _, header_text = head.partition("\r\n")
            length = 0
            for line in header_text.split("\r\n"):
                name, _, value = line.partition(":")
                name = name.strip().lower()
                if name == "content-length":
                    length = int(value.strip()) if value.strip().isdigit() else -1
                elif name == "transfer-encoding":
                    length = -1
            if not 0 <= length <= _MAX_BODY:
                self._fail(b"400 Bad Request")
                return
            if len(self.buffer) < end + 4 + length:
                return
            del self.buffer[: end + 4 + length]
            method, _, rest = request_line.partition(" ")
            target = rest.rpartition(" ")[0]
            self._answer(method, target)

    def _answer(self, method: str, target: str) -> None:
        transport = self.transport
        assert transport is not None
        path, _, query = target.partition("?")
        if method == "GET" and path == POD_PATH:
            transport.write(_POD_RESPONSE)
        elif method == "GET" and path == BULK_PATH:
            size = DEFAULT_BULK
            for item in query.split("&"):
                key, _, value = item.partition("=")
                if key == "size" and value.isdigit():
                    size = min(int(value), _MAX_BULK)
            transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                + f"Content-Length: {size}\r\n\r\n".encode()
            )
            self.bulk_left = size
            self._pump()
        elif method == "GET" and path == _PODS and "watch=true" in query:
            transport.write(_WATCH_HEAD)
            self.watching = True
            self.state.watchers.add(self)
        elif method == "POST" and path == "/control/emit":
            started = time.monotonic()
            reached = 0
            for watcher in list(self.state.watchers):
                if watcher.transport is not None:
                    watcher.transport.write(_EVENT_CHUNK)
                    reached += 1
            self._json({"watchers": reached, "started": started, "finished": time.monotonic()})
        elif method == "GET" and path == "/control/stats":
            self._json({"watchers": len(self.state.watchers), "bulk_bytes": self.state.bulk_bytes})
        elif method == "GET" and path == "/healthz":
            self._json({"status": "ok"})
        else:
            self._json({"kind": "Status", "code": 404, "reason": "NotFound"}, b"404 Not Found")

    def _pump(self) -> None:
        transport = self.transport
        while self.bulk_left > 0 and not self.paused and transport is not None:
            size = min(self.bulk_left, _CHUNK)
            transport.write(_ZEROS if size == _CHUNK else _ZEROS[:size])
            self.bulk_left -= size
            self.state.bulk_bytes += size

    def _json(self, body: object, status: bytes = b"200 OK") -> None:
        assert self.transport is not None
        data = json.dumps(body).encode()
        self.transport.write(
            b"HTTP/1.1 "
            + status
            + b"\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )

    def _fail(self, status: bytes) -> None:
        assert self.transport is not None
        self.transport.write(b"HTTP/1.1 " + status + b"\r\nConnection: close\r\n\r\n")
        self.transport.close()


async def serve(port: int, tls_port: int, cert: str | None, key: str | None) -> None:
    """Serve on 127.0.0.1 until SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    state = _State()
    servers = [await loop.create_server(lambda: _Http(state), "127.0.0.1", port, backlog=2048)]
    if cert and key:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        context.set_alpn_protocols(["http/1.1"])
        servers.append(
            await loop.create_server(
                lambda: _Http(state), "127.0.0.1", tls_port, ssl=context, backlog=2048
            )
        )
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    print("ready", flush=True)
    await stop.wait()
    for server in servers:
        server.close()
    for watcher in list(state.watchers):
        if watcher.transport is not None:
            watcher.transport.abort()
    for server in servers:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.wait_closed(), 2.0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.proxy_upstream", description=__doc__)
    parser.add_argument("--port", type=int, required=True, help="plain HTTP port on 127.0.0.1")
    parser.add_argument("--tls-port", type=int, default=0, help="TLS port on 127.0.0.1")
    parser.add_argument("--cert", help="PEM certificate (chain) for the TLS port")
    parser.add_argument("--key", help="PEM key of --cert")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.port, args.tls_port, args.cert, args.key))
    return 0


if __name__ == "__main__":
    sys.exit(main())
