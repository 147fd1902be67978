"""The API server as helm sees it: through the agent, on loopback, under the commands' rule.

Helm reads and writes the cluster by itself: a chart's ``lookup`` reads any
object the credentials it is given can read, and a template may name any
namespace. Given the agent's own credentials, a chart could read the agent's
key from its namespace and connect as the cluster's agent, or overwrite what
the agent keeps there. So helm is never given them. Each helm process gets a
kubeconfig of its own whose server is this gateway, on 127.0.0.1, and whose
token is good for that process only (:meth:`CommandsGateway.kubeconfig`). The
gateway checks each request against the rule every command keeps
(:func:`refusal`), then relays it to the API server with the agent's
credentials, streaming the answer (``helm --wait`` watches).

Refused, with a Kubernetes ``Status`` helm prints:

- anything in the agent's own namespace, the namespace object included;
- Secrets listed or watched across every namespace (the agent's among them);
- impersonation, and connections into pods (exec, attach, port-forward, proxy);
- a path that the API server could read another way (``tunnel_kube.paths``);
- a write to a path that is not an API resource.

OpenTofu does not go through it: its state lives in the agent's namespace, and
a module is code that runs as the agent anyway (docs/security.md, "Commands").
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import logging
import secrets
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web

from protocol.http import HOP_BY_HOP
from tunnel_kube.paths import UNPLAIN_PATH, is_plain_path
from tunnel_kube.requests import parse_api_request
from tunnel_kube.status import JSON, status_body
from tunnel_pki.files import create_private_file

from ..kubeapi import KubeApi
from .errors import own_namespace_error

__all__ = ["MAX_REQUEST_BODY", "CommandsGateway", "refusal"]

logger = logging.getLogger(__name__)

#: The largest request body relayed (the API server's own limit is 3 MiB).
MAX_REQUEST_BODY = 4 * 1024 * 1024
#: Requests one helm process may have in progress (helm --wait watches a few kinds at once).
MAX_REQUESTS_PER_PROCESS = 64

#: Request headers not relayed: the connection's own, and the credentials, which the agent sets.
_NOT_RELAYED = frozenset({*HOP_BY_HOP, "host", "authorization", "content-length"})


def refusal(
    method: str, target: str, headers: Mapping[str, str], own_namespace: str | None
) -> str | None:
    """Why a command's request of ``method`` on ``target`` (path and query) is refused, or None."""
    if any(name.lower().startswith("impersonate-") for name in headers):
        return "a command may not impersonate anyone: it acts as the agent"
    if "upgrade" in headers.get("Connection", "").lower() or "Upgrade" in headers:
        return "a command opens no connection into the cluster (exec, attach, port-forward)"
    path = target.partition("?")[0]
    if not path.startswith("/") or not is_plain_path(path):
        return UNPLAIN_PATH
    request = parse_api_request(method, target)
    if not request.is_resource:
        if method not in ("GET", "HEAD"):
            return f"{method} {path} is not an API resource a command may write"
        return None
    if request.is_connect:
        return "a command opens no connection into the cluster (exec, attach, port-forward, proxy)"
    if own_namespace is not None and request.namespace == own_namespace:
        return str(own_namespace_error(own_namespace, path))
    if request.resource == "secrets" and not request.namespace:
        return (
            "a command may not read Secrets across every namespace (the agent's own is among"
            " them); name the namespace"
        )
    return None


@dataclass(frozen=True, slots=True)
class _Grant:
    """What one helm process may reach, and its requests in progress."""

    own_namespace: str | None
    label: str
    requests: set[asyncio.Task[object]] = field(default_factory=set)


class CommandsGateway:
    """A loopback endpoint relaying commands' API requests under :func:`refusal`.

    Started by the first :meth:`kubeconfig`; :meth:`close` stops it.
    """

    def __init__(self, kube: KubeApi, *, host: str = "127.0.0.1") -> None:
        self._kube = kube
        self._host = host
        self._grants: dict[str, _Grant] = {}
        self._runner: web.AppRunner | None = None
        self._url = ""
        self._starting = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def kubeconfig(
        self, directory: Path, *, own_namespace: str | None, label: str
    ) -> AsyncIterator[Path]:
        """A kubeconfig file in ``directory`` for one process, good until the block ends."""
        await self._start()
        token = secrets.token_urlsafe(32)
        key = _key(token)
        self._grants[key] = _Grant(own_namespace, label)
        path = directory / f"kubeconfig-{secrets.token_hex(4)}.json"
        try:
            # JSON is YAML: client-go reads it as a kubeconfig.
            create_private_file(path, json.dumps(_kubeconfig(self._url, token)).encode())
            yield path
        finally:
            grant = self._grants.pop(key)
            path.unlink(missing_ok=True)
            # What a descendant still has in progress ends with the grant.
            for task in grant.requests:
                task.cancel()

    @property
    def grants(self) -> int:
        """Kubeconfigs in use."""
        return len(self._grants)

    async def close(self) -> None:
        """Stop listening; requests in progress are cut."""
        async with self._starting:
            if self._runner is not None:
                await self._runner.cleanup()
                self._runner = None

    async def _start(self) -> None:
        async with self._starting:
            if self._runner is not None:
                return
            app = web.Application(client_max_size=MAX_REQUEST_BODY)
            app.router.add_route("*", "/{tail:.*}", self._handle)
            runner = web.AppRunner(
                app,
                access_log=None,
                handle_signals=False,
                # A helm that leaves ends its requests: a watch it held must
                # not stay open to the API server.
                handler_cancellation=True,
                shutdown_timeout=1.0,
            )
            await runner.setup()
            site = web.TCPSite(runner, self._host, 0)
            await site.start()
            port = runner.addresses[0][1]
            self._runner = runner
            self._url = f"http://{self._host}:{port}"
            logger.info("commands' API gateway on %s", self._url)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        grant = self._grants.get(_key(_bearer(request.headers.get("Authorization", ""))))
        if grant is None:
            return _status(401, "Unauthorized", "this gateway serves the agent's helm runs only")
        target = request.raw_path
        why = refusal(request.method, target, request.headers, grant.own_namespace)
        if why is not None:
            logger.info("refused %s %s of %s: %s", request.method, target[:200], grant.label, why)
            return _status(403, "Forbidden", why)
        # Counted before the body is read: at most this many bodies are held at once.
        if len(grant.requests) >= MAX_REQUESTS_PER_PROCESS:
            return _status(
                429,
                "TooManyRequests",
                f"a command may have {MAX_REQUESTS_PER_PROCESS} requests in progress at most",
            )
        task = asyncio.current_task()
        assert task is not None
        grant.requests.add(task)
        try:
            try:
                body = await request.read()
            except web.HTTPRequestEntityTooLarge:
                return _status(413, "RequestEntityTooLarge", "the request body is over 4 MiB")
            return await self._relay(request, target, body)
        finally:
            grant.requests.discard(task)

    async def _relay(self, request: web.Request, target: str, body: bytes) -> web.StreamResponse:
        # Pairs, not a dict: a header sent twice (Accept, say) goes on twice.
        headers = [
            (name, value)
            for name, value in request.headers.items()
            if name.lower() not in _NOT_RELAYED
        ]
        authorization = await self._kube.authorization()
        if authorization is not None:
            headers.append(("Authorization", authorization))
        try:
            async with self._kube.session.request(
                request.method,
                self._kube.url(target),
                headers=headers,
                # A file-like body: aiohttp warns of (and chunks) raw bytes over 1 MiB.
                data=io.BytesIO(body) if body else None,
                allow_redirects=False,
            ) as upstream:
                return await _relay_answer(request, upstream)
        except (aiohttp.ClientError, OSError) as exc:
            return _status(502, "BadGateway", f"cannot reach the API server: {exc}")


async def _relay_answer(
    request: web.Request, upstream: aiohttp.ClientResponse
) -> web.StreamResponse:
    response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
    for name, value in upstream.headers.items():
        if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
            response.headers.add(name, value)
    await response.prepare(request)
    try:
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)  # a watch's events as they come
    except (aiohttp.ClientError, OSError) as exc:
        # The head is out: no other answer can follow it. Cut the connection
        # without the body's last chunk, so that helm sees the answer broken
        # rather than complete (a watch is then started again).
        logger.warning("the API server's answer broke off: %s", exc)
        if request.transport is not None:
            request.transport.abort()
        return response
    await response.write_eof()
    return response


def _status(code: int, reason: str, message: str) -> web.Response:
    return web.Response(status=code, body=status_body(code, reason, message), content_type=JSON)


def _bearer(authorization: str) -> str:
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _key(token: str) -> str:
    """What a token is looked up by: its digest (the lookup's timing says nothing of it)."""
    return hashlib.sha256(token.encode()).hexdigest()


def _kubeconfig(server: str, token: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "cluster", "cluster": {"server": server}}],
        "users": [{"name": "command", "user": {"token": token}}],
        "contexts": [{"name": "command", "context": {"cluster": "cluster", "user": "command"}}],
        "current-context": "command",
    }
