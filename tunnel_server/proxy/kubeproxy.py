"""``/k8s/clusters/{cluster}/...`` through aiohttp: upgrades and unusual requests.

Plain requests are served by the lean front end (:mod:`tunnel_server.edge.frontdoor`);
it hands aiohttp the connections it does not serve: upgrades (exec, attach,
port-forward, relayed byte for byte after the 101), chunked request bodies,
``Expect``, HTTP/1.0 and malformed cluster names. Both share the checks of
:mod:`tunnel_server.proxy.request`: the caller's credentials never leave the
server, the agent calls the API server with its own, impersonating
``tunnel:<user>``, and errors come back as Kubernetes ``Status`` objects.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiohttp import web

from tunnel_mux import MuxStream, SessionError
from tunnel_mux.upgraded import UpgradedReader
from tunnel_server.context import CONTEXT
from tunnel_server.proxy.answer import answer_framing
from tunnel_server.proxy.exchange import ProxyExchange
from tunnel_server.proxy.refusal import ProxyRefusal, revoked_reason
from tunnel_server.proxy.request import ProxiedRequest
from tunnel_server.proxy.wsframes import CLOSE_GOING_AWAY, CLOSE_POLICY, FrameBoundary, close_frame

__all__ = ["PROXY_ROUTE", "setup_kube_proxy"]

logger = logging.getLogger(__name__)

PROXY_ROUTE = "/k8s/clusters/{cluster}/{tail:.*}"
#: Why an upgrade request with a body is refused. After its 101, the bytes that
#: follow belong to the upgraded protocol; before it, a body would be read by
#: the API server's side alone, and the agent's connection to it would no
#: longer agree on where the next request starts.
UPGRADE_WITH_BODY = (
    "an upgrade request (exec, attach, port-forward) cannot carry a body: "
    "send it without Content-Length or Transfer-Encoding"
)
#: After a close frame, how long the caller's answer to it is waited for.
CLOSE_GRACE = 1.0


def setup_kube_proxy(app: web.Application) -> None:
    app.router.add_route("*", PROXY_ROUTE, kube_proxy)


async def kube_proxy(request: web.Request) -> web.StreamResponse:
    proxied = ProxiedRequest(
        request.app[CONTEXT], request.match_info["cluster"][:63], request.method
    )
    exchange = proxied.exchange
    try:
        upgrade = _upgrade_of(request)
        if upgrade is not None and _announces_body(request):
            raise ProxyRefusal(400, "BadRequest", UPGRADE_WITH_BODY)
        has_body = upgrade is not None or request.body_exists
        headers = [(name.lower(), value) for name, value in request.headers.items()]
        await proxied.open(request.raw_path, headers, upgrade=upgrade, has_body=has_body)
        if has_body and upgrade is None:
            proxied.upload(request.content.readany)
        return await _exchange(request, proxied, upgrade is not None)
    except ProxyRefusal as refusal:
        exchange.refused(refusal)
        body, headers = refusal.answer(request.headers.get("Accept", ""), request.raw_path)
        # aiohttp sets Content-Length itself.
        fields = {name: value for name, value in headers if name != "content-length"}
        return web.Response(status=refusal.code, body=body, headers=fields)
    except asyncio.CancelledError:
        if not exchange.ended:
            exchange.cut_short("cancelled: the caller left, or the server is shutting down")
        raise
    finally:
        await proxied.close()


async def _exchange(
    request: web.Request, proxied: ProxiedRequest, upgrade: bool
) -> web.StreamResponse:
    exchange = proxied.exchange
    stream = proxied.stream
    assert stream is not None
    head, body = await proxied.response_head(upgrade=upgrade)
    if head.status == 101:
        return await _relay_upgraded(request, stream, head.headers, head.reason, body, exchange)
    # The same check of the answer's head and framing as the lean path's.
    framing = answer_framing(request.method, head, exchange.cluster)
    response = web.StreamResponse(status=head.status, reason=framing.reason)
    for name, value in framing.headers:
        # aiohttp frames the body itself (chunked); the answer's length is
        # held to below, and told the caller only for a HEAD.
        if name not in ("content-length", "transfer-encoding") or (
            name == "content-length" and request.method == "HEAD"
        ):
            response.headers.add(name, value)
    await response.prepare(request)
    remaining = framing.length
    try:
        chunk = body
        while True:
            if chunk:
                if remaining is not None:
                    if len(chunk) > remaining:
                        raise SessionError("the agent sent more than its Content-Length")
                    remaining -= len(chunk)
                exchange.bytes_out += len(chunk)
                await response.write(chunk)
            chunk = await stream.read()
            if not chunk:
                break
    except SessionError as exc:
        # The agent went away mid-response: end the caller's connection
        # without the final chunk, so the client sees the break (kubectl
        # get -w exits with an error; informers list and watch again).
        logger.info("response cut short: %s", exc, extra={"cluster": exchange.cluster})
        exchange.cut_short(exc)
        if request.transport is not None:
            request.transport.close()
        return response
    except ConnectionError:
        # The caller went away mid-response: end the relayed request too.
        logger.info("the caller left mid-response", extra={"cluster": exchange.cluster})
        exchange.cut_short("the caller left")
        stream.reset()
        return response
    if remaining:
        # As the lean path does: the caller sees the break, not a shorter answer.
        logger.info("the agent's answer ended short of its Content-Length")
        exchange.cut_short("the agent's answer ended short of its Content-Length")
        if request.transport is not None:
            request.transport.close()
        return response
    with contextlib.suppress(ConnectionError):
        await response.write_eof()
    return response


async def _relay_upgraded(
    request: web.Request,
    stream: MuxStream,
    headers: tuple[tuple[str, str], ...],
    reason: str,
    early: bytes,
    exchange: ProxyExchange,
) -> web.StreamResponse:
    """After a 101, relay the caller's connection byte for byte, both ways."""
    reader = UpgradedReader(request.transport)
    # The reader goes in before the 101 is sent, so no byte the caller sends
    # after it can be parsed as HTTP (docs/architecture.md, "Upgrades").
    request.protocol.set_parser(reader)  # type: ignore[arg-type]
    response = web.StreamResponse(status=101, reason=reason or "Switching Protocols")
    for name, value in headers:
        if name not in ("transfer-encoding", "content-length", "keep-alive"):
            response.headers.add(name, value)
    response.force_close()
    await response.prepare(request)
    transport = request.transport
    assert transport is not None
    # A WebSocket's frames are followed, so that a break can be told in a close frame.
    websocket = any(name == "upgrade" and value.lower() == "websocket" for name, value in headers)
    frames = FrameBoundary() if websocket else None

    async def downstream() -> None:
        if early:
            exchange.bytes_out += len(early)
            if frames is not None:
                frames.feed(early)
            await response.write(early)
        while chunk := await stream.read():
            exchange.bytes_out += len(chunk)
            if frames is not None:
                frames.feed(chunk)
            await response.write(chunk)  # waits while the caller's socket is full

    async def upstream() -> None:
        while chunk := await reader.read():
            exchange.bytes_in += len(chunk)
            await stream.write(chunk)
        stream.end()  # the caller half-closed: pass it on

    tasks = [asyncio.create_task(downstream()), asyncio.create_task(upstream())]
    try:
        # Done when the agent side ends; the caller's EOF only half-closes.
        await tasks[0]
    except (SessionError, ConnectionError) as exc:
        logger.info("upgraded connection ended: %s", exc, extra={"cluster": exchange.cluster})
        exchange.cut_short(exc if isinstance(exc, SessionError) else "the caller left")
        if isinstance(exc, SessionError) and frames is not None and frames.at_boundary:
            code = CLOSE_POLICY if revoked_reason(exc) is not None else CLOSE_GOING_AWAY
            transport.write(close_frame(code, exchange.ended or str(exc)))
            # Closing with the caller's bytes unread would reset the connection
            # and could lose the close frame: read (and drop) until the caller
            # answers it and closes, for a moment at most.
            tasks[1].cancel()
            await asyncio.gather(tasks[1], return_exceptions=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(_drop_until_end(reader), CLOSE_GRACE)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        transport.close()
    return response


async def _drop_until_end(reader: UpgradedReader) -> None:
    while await reader.read():
        pass


def _upgrade_of(request: web.Request) -> str | None:
    """The protocol an upgrade request asks for, or None for a plain request."""
    tokens = {
        token.strip().lower()
        for value in request.headers.getall("Connection", ())
        for token in value.split(",")
    }
    upgrade = request.headers.get("Upgrade")
    return upgrade if upgrade and "upgrade" in tokens else None


def _announces_body(request: web.Request) -> bool:
    """The request says a body follows its head (a Content-Length above 0, or chunks)."""
    lengths = request.headers.getall("Content-Length", ())
    return "Transfer-Encoding" in request.headers or any(v.strip() != "0" for v in lengths)
