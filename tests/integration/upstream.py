"""A minimal HTTP upstream standing in for an API server, to test the relay itself.

It records each request's headers, streams a chunked body on demand, echoes
request bodies, and answers a WebSocket upgrade by echoing messages. The full
Kubernetes stand-in (tests.kubestub) is for kubectl-level tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from aiohttp import web
from multidict import CIMultiDictProxy

from tunnel_mux.upgraded import UpgradedReader


@dataclass
class Upstream:
    url: str = ""
    requests: list[tuple[str, str, CIMultiDictProxy[str]]] = field(default_factory=list)
    stream_lines: asyncio.Queue[bytes | None] = field(default_factory=asyncio.Queue)
    stream_started: asyncio.Event = field(default_factory=asyncio.Event)
    raw_ended: asyncio.Event = field(default_factory=asyncio.Event)
    stream_transports: list[asyncio.BaseTransport] = field(default_factory=list)


@asynccontextmanager
async def running_upstream() -> AsyncIterator[Upstream]:
    upstream = Upstream()

    async def record(request: web.Request) -> None:
        upstream.requests.append((request.method, request.path_qs, request.headers))

    async def echo(request: web.Request) -> web.StreamResponse:
        await record(request)
        if request.headers.get("Upgrade", "") == "SPDY/3.1":
            return await raw_echo(request)
        if request.headers.get("Upgrade", "").lower() == "websocket":
            ws = web.WebSocketResponse(protocols=["v5.channel.k8s.io"])
            await ws.prepare(request)
            async for message in ws:
                await ws.send_bytes(b"echo:" + message.data)
            return ws
        if request.path.endswith("/stream"):
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            await response.prepare(request)
            if request.transport is not None:
                upstream.stream_transports.append(request.transport)
            upstream.stream_started.set()
            while (line := await upstream.stream_lines.get()) is not None:
                await response.write(line)
            await response.write_eof()
            return response
        if request.path.endswith("/missing"):
            return web.json_response(
                {"kind": "Status", "reason": "NotFound", "code": 404}, status=404
            )
        body = await request.read()
        return web.json_response(
            {"method": request.method, "path": request.path_qs, "body": body.decode()},
            headers={"X-Upstream": "yes"},
        )

    async def raw_echo(request: web.Request) -> web.StreamResponse:
        # A non-WebSocket upgrade: after the 101, echo raw bytes until EOF.
        reader = UpgradedReader(request.transport)
        request.protocol.set_parser(reader)  # type: ignore[arg-type]
        response = web.StreamResponse(
            status=101, headers={"Connection": "Upgrade", "Upgrade": "SPDY/3.1"}
        )
        response.force_close()
        await response.prepare(request)
        while chunk := await reader.read():
            await response.write(b"echo:" + chunk)
        upstream.raw_ended.set()
        if request.transport is not None:
            request.transport.close()
        return response

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", echo)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server = site._server
    assert isinstance(server, asyncio.Server)
    upstream.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield upstream
    finally:
        await upstream.stream_lines.put(None)
        await runner.cleanup()
