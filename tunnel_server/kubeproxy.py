"""``/k8s/clusters/{cluster}/...``: the Kubernetes API of a cluster, through its agent.

Each request is authenticated (bearer API token), checked against the user's
grant on the cluster, and relayed on a new ``http`` stream of that cluster's
agent session: head in the OPEN frame, bodies streamed both ways as they are
produced, upgrades (exec, attach, port-forward) relayed byte for byte after
the 101. The caller's credentials never leave the server: the agent calls the
API server with its own, impersonating ``tunnel:<user>``. Errors come back as
Kubernetes ``Status`` objects, so kubectl prints them as it prints the API
server's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from protocol import kinds
from protocol.errors import LocalProtocolError, MalformedFrameError
from protocol.http import RequestHead, ResponseHeadParser
from tunnel_kube import parse_api_request
from tunnel_mux import MuxStream, SessionError
from tunnel_mux.upgraded import UpgradedReader

from .auth import bearer_token
from .context import CONTEXT, ServerContext, utcnow
from .errors import ServerError, UnauthorizedError
from .store.base import AuditEvent, Grant, User

__all__ = ["IDENTITY_PREFIX", "PROXY_ROUTE", "impersonation_headers", "setup_kube_proxy"]

logger = logging.getLogger(__name__)

PROXY_ROUTE = "/k8s/clusters/{cluster}/{tail:.*}"
#: Every identity the server asserts in a cluster carries this prefix.
IDENTITY_PREFIX = "tunnel:"

# Never forwarded: hop-by-hop headers, and the caller's own credentials.
_DROPPED = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "x-forwarded-for",
        "x-forwarded-host",
        "x-forwarded-proto",
    }
)
_DROPPED_RESPONSE = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding"}
)


def setup_kube_proxy(app: web.Application) -> None:
    app.router.add_route("*", PROXY_ROUTE, kube_proxy)


def impersonation_headers(user: User, grant: Grant) -> list[tuple[str, str]]:
    """The identity the cluster sees: ``tunnel:<user>`` in ``tunnel:<group>`` groups."""
    headers = [("impersonate-user", IDENTITY_PREFIX + user.name)]
    for group in dict.fromkeys((*user.groups, *grant.as_groups)):
        headers.append(("impersonate-group", IDENTITY_PREFIX + group))
    return headers


@dataclass(slots=True)
class _Exchange:
    """What the audit event of one proxied request records."""

    user: str | None = None
    cluster: str | None = None
    verb: str = ""
    path: str = ""
    status: int = 0
    bytes_in: int = 0
    bytes_out: int = 0


async def kube_proxy(request: web.Request) -> web.StreamResponse:
    context = request.app[CONTEXT]
    started = time.monotonic()
    exchange = _Exchange(cluster=request.match_info["cluster"][:63])
    try:
        return await _relay(request, context, exchange)
    except _Refusal as refusal:
        exchange.status = refusal.code
        return refusal.response()
    finally:
        context.metrics.observe_proxy(
            exchange.verb or request.method.lower(), exchange.status, time.monotonic() - started
        )
        if exchange.user is not None:
            await context.audit.record(
                AuditEvent(
                    id=None,
                    time=utcnow(),
                    user=exchange.user,
                    cluster=exchange.cluster,
                    kind="proxy",
                    verb=exchange.verb,
                    path=exchange.path[:512],
                    status=exchange.status,
                    bytes_in=exchange.bytes_in,
                    bytes_out=exchange.bytes_out,
                    duration_ms=round((time.monotonic() - started) * 1000),
                )
            )


async def _relay(
    request: web.Request, context: ServerContext, exchange: _Exchange
) -> web.StreamResponse:
    cluster = exchange.cluster or ""
    user = await _authenticate(request, context)
    exchange.user = user.name
    grant = await context.access.grant(user.name, cluster)
    if grant is None:
        raise _Refusal(403, "Forbidden", f"user {user.name} has no grant on cluster {cluster}")
    path = _upstream_path(request, cluster)
    exchange.path = path.split("?", 1)[0]
    api_request = parse_api_request(request.method, path)
    # exec, attach, portforward are audited as what they are, not as get/create.
    exchange.verb = api_request.subresource if api_request.is_connect else api_request.verb
    headers = _forwarded_headers(request, user, grant)
    agent = context.registry.get(cluster)
    if agent is None:
        # Fail fast: no waiting for an agent that may never come.
        raise _Refusal(
            503, "ServiceUnavailable", f"cluster {cluster} is not connected (its agent is offline)"
        )
    upgrade = _is_upgrade(request)
    has_body = upgrade or request.body_exists
    head = RequestHead(request.method, path, tuple(headers), upgrade)
    try:
        stream = agent.session.open_stream(
            kinds.STREAM_HTTP, head.to_open_headers(), end_stream=not has_body
        )
    except (LocalProtocolError, SessionError) as exc:
        raise _Refusal(
            503, "ServiceUnavailable", f"cluster {cluster} cannot take the request now: {exc}"
        ) from exc
    try:
        return await _exchange(request, stream, upgrade, has_body, exchange)
    finally:
        if stream.error is None and not stream.at_eof:
            stream.reset()


async def _exchange(
    request: web.Request,
    stream: MuxStream,
    upgrade: bool,
    has_body: bool,
    exchange: _Exchange,
) -> web.StreamResponse:
    parser = ResponseHeadParser()
    uploader: asyncio.Task[None] | None = None
    if has_body and not upgrade:
        uploader = asyncio.create_task(_upload(request, stream, exchange))
    try:
        body = b""
        while parser.head is None:
            try:
                chunk = await stream.read()
            except SessionError as exc:
                raise _Refusal(
                    502, "BadGateway", f"cluster {exchange.cluster} dropped the request: {exc}"
                ) from exc
            if not chunk:
                raise _Refusal(502, "BadGateway", "the agent ended the stream without answering")
            try:
                body = parser.feed(chunk)
            except MalformedFrameError as exc:
                raise _Refusal(502, "BadGateway", f"the agent's answer is invalid: {exc}") from exc
        head = parser.head
        exchange.status = head.status
        if head.status == 101 and upgrade:
            return await _relay_upgraded(request, stream, head.headers, head.reason, body, exchange)
        response = web.StreamResponse(status=head.status, reason=head.reason or None)
        for name, value in head.headers:
            if name not in _DROPPED_RESPONSE:
                response.headers.add(name, value)
        await response.prepare(request)
        try:
            if body:
                exchange.bytes_out += len(body)
                await response.write(body)
            while chunk := await stream.read():
                exchange.bytes_out += len(chunk)
                await response.write(chunk)
        except SessionError as exc:
            # The agent went away mid-response: end the caller's connection
            # without the final chunk, so the client sees the break (kubectl
            # get -w exits with an error; informers list and watch again).
            logger.info("response cut short: %s", exc, extra={"cluster": exchange.cluster})
            if request.transport is not None:
                request.transport.close()
            return response
        except ConnectionError:
            # The caller went away mid-response: end the relayed request too.
            logger.info("the caller left mid-response", extra={"cluster": exchange.cluster})
            stream.reset()
            return response
        with contextlib.suppress(ConnectionError):
            await response.write_eof()
        return response
    finally:
        if uploader is not None:
            uploader.cancel()
            await asyncio.gather(uploader, return_exceptions=True)


async def _upload(request: web.Request, stream: MuxStream, exchange: _Exchange) -> None:
    """Stream the caller's request body to the agent."""
    try:
        while chunk := await request.content.readany():
            exchange.bytes_in += len(chunk)
            await stream.write(chunk)
        stream.end()
    except SessionError:
        pass  # the download side reports it
    except ConnectionError:
        stream.reset()


async def _relay_upgraded(
    request: web.Request,
    stream: MuxStream,
    headers: tuple[tuple[str, str], ...],
    reason: str,
    early: bytes,
    exchange: _Exchange,
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

    async def downstream() -> None:
        if early:
            exchange.bytes_out += len(early)
            await response.write(early)
        while chunk := await stream.read():
            exchange.bytes_out += len(chunk)
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
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        transport.close()
    return response


async def _authenticate(request: web.Request, context: ServerContext) -> User:
    try:
        token = bearer_token(request)
    except UnauthorizedError as exc:
        raise _Refusal(401, "Unauthorized", exc.message) from exc
    user = await context.access.user_for_token(token)
    if user is None:
        raise _Refusal(401, "Unauthorized", "the API token is not valid")
    return user


def _upstream_path(request: web.Request, cluster: str) -> str:
    """The path (and query) to ask the cluster's API server for, or 400."""
    raw = request.raw_path
    prefix = f"/k8s/clusters/{cluster}"
    if not raw.startswith(prefix + "/") and raw != prefix and not raw.startswith(prefix + "?"):
        raise _Refusal(400, "BadRequest", "the cluster name must not be encoded")
    rest = raw[len(prefix) :] or "/"
    if rest.startswith("?"):
        rest = "/" + rest
    path, _, query = rest.partition("?")
    lowered = path.lower()
    if (
        "%2f" in lowered
        or "%5c" in lowered
        or "%2e" in lowered
        or "\\" in path
        or "//" in path
        or any(segment in (".", "..") for segment in path.split("/"))
    ):
        raise _Refusal(400, "BadRequest", "the path must not contain dot or encoded segments")
    return f"{path}?{query}" if query else path


def _forwarded_headers(request: web.Request, user: User, grant: Grant) -> list[tuple[str, str]]:
    headers: list[tuple[str, str]] = []
    impersonated: list[tuple[str, str]] = []
    for name, value in request.headers.items():
        lower = name.lower()
        if lower.startswith("impersonate-"):
            impersonated.append((lower, value))
        elif lower not in _DROPPED:
            headers.append((lower, value))
    if _is_upgrade(request):
        headers.append(("connection", "Upgrade"))
        headers.append(("upgrade", request.headers.get("Upgrade", "")))
    if impersonated:
        headers.extend(_caller_impersonation(impersonated, user, grant))
    else:
        headers.extend(impersonation_headers(user, grant))
    return headers


def _caller_impersonation(
    requested: list[tuple[str, str]], user: User, grant: Grant
) -> list[tuple[str, str]]:
    """The caller's own --as/--as-group, allowed only by its grant, inside our prefix."""
    if not grant.impersonate:
        raise _Refusal(
            403,
            "Forbidden",
            f"user {user.name} may not impersonate on this cluster "
            "(Impersonate-* headers are refused without an impersonate grant)",
        )
    headers = []
    for name, value in requested:
        if name not in ("impersonate-user", "impersonate-group"):
            raise _Refusal(403, "Forbidden", f"the {name} header is not supported")
        if value.startswith("system:") or not value or len(value) > 256:
            raise _Refusal(403, "Forbidden", f"{value[:64]!r} cannot be impersonated")
        headers.append(
            (name, value if value.startswith(IDENTITY_PREFIX) else IDENTITY_PREFIX + value)
        )
    if not any(name == "impersonate-user" for name, _ in headers):
        raise _Refusal(403, "Forbidden", "Impersonate-Group needs Impersonate-User")
    return headers


def _is_upgrade(request: web.Request) -> bool:
    connection = request.headers.get("Connection", "").lower()
    return "upgrade" in connection and bool(request.headers.get("Upgrade"))


class _Refusal(ServerError):
    """Answer the caller with a Kubernetes Status and stop."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message

    def response(self) -> web.Response:
        return kube_status(self.code, self.reason, self.message)


def kube_status(code: int, reason: str, message: str) -> web.Response:
    """A ``metav1.Status`` failure, as the API server would answer."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    response = web.Response(
        status=code, body=json.dumps(body).encode(), content_type="application/json"
    )
    if code == 503:
        response.headers["Retry-After"] = "1"
    return response
