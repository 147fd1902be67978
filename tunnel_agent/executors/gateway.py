"""The API server as a command's tools see it: through the agent, with a per-run credential.

Helm and OpenTofu read and write the cluster by themselves (a chart's
``lookup``, a module's providers and its ``local-exec``), and what comes with
a command is code. So they never hold the agent's credentials. Each process
gets a kubeconfig of its own whose server is this gateway (on 127.0.0.1, or
an address a run's Job pod reaches) and whose bearer token is random, bound to
one identity (the command's submitter, :class:`~tunnel_agent.identity.RunIdentity`),
one run and an expiry, and forgotten when the run's step ends
(:meth:`CommandsGateway.kubeconfig`). The gateway checks each request against
the rule every command keeps (:func:`refusal`; a run's own ``Impersonate-*``
headers are refused), then relays it to the API server with the agent's
credentials plus ``Impersonate-User``/``-Group`` of that identity, streaming
the answer (``helm --wait`` watches). So the cluster's RBAC judges a run's
requests as it judges the submitter's kubectl.

One exception, :class:`TofuState`: OpenTofu's ``kubernetes`` backend keeps
its state in the agent's namespace by default. The state Secret
``tfstate-default-<suffix>`` and lock Lease ``lock-tfstate-default-<suffix>``
of that run's suffix, and nothing else there, are relayed as the agent.

Refused, with a Kubernetes ``Status`` helm prints:

- anything in the agent's own namespace, the namespace object included;
- Secrets listed or watched across every namespace (the agent's among them);
- impersonation, and connections into pods (exec, attach, port-forward, proxy);
- a path that the API server could read another way (``tunnel_kube.paths``);
- a write to a path that is not an API resource.

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
from urllib.parse import parse_qsl

import aiohttp
from aiohttp import web

from protocol.http import HOP_BY_HOP
from tunnel_kube.paths import UNPLAIN_PATH, is_plain_path
from tunnel_kube.requests import parse_api_request
from tunnel_kube.status import JSON, status_body
from tunnel_pki.files import create_private_file

from ..identity import AGENT, RunIdentity
from ..kubeapi import KubeApi
from .errors import own_namespace_error

__all__ = ["MAX_REQUEST_BODY", "CommandsGateway", "TofuState", "refusal"]

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
    if any(name.lower().replace("_", "-").startswith("impersonate-") for name in headers):
        return "a command may not impersonate anyone: its identity is set by the agent"
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
class TofuState:
    """Where a run's OpenTofu state is kept, when that is the agent's own namespace."""

    namespace: str
    suffix: str

    def concerns(self, method: str, target: str) -> bool:
        """Whether ``target`` may be this state (:meth:`allows` decides, with the body)."""
        request = parse_api_request(method, target)
        return request.namespace == self.namespace and (request.api_group, request.resource) in (
            ("", "secrets"),
            ("coordination.k8s.io", "leases"),
        )

    def allows(self, method: str, target: str, body: bytes) -> bool:
        """Whether ``method`` on ``target`` touches this state (its Secret, its lock) only.

        Relayed as the agent: the submitter needs no right in the agent's
        namespace, and gets none beyond this state. A create names its object
        in the body, so the body must name this state's and be of no special
        type (a service-account token Secret would mint a token).
        """
        query = target.partition("?")[2]
        request = parse_api_request(method, target)
        if request.namespace != self.namespace or request.subresource:
            return False
        secret = f"tfstate-default-{self.suffix}"
        if (request.api_group, request.resource) == ("", "secrets"):
            wanted = secret
        elif (request.api_group, request.resource) == ("coordination.k8s.io", "leases"):
            wanted = f"lock-{secret}"
        else:
            return False
        if request.name:
            return request.name == wanted and request.verb in (
                "get",
                "update",
                "patch",
                "delete",
            )
        if request.verb == "list" and request.resource == "secrets":
            # The backend lists its workspaces by label: this suffix's only.
            selector = dict(
                pair.split("=", 1)
                for pair in _query(query).get("labelSelector", "").split(",")
                if "=" in pair
            )
            return selector == {"tfstate": "true", "tfstateSecretSuffix": self.suffix}
        if request.verb == "create":
            try:
                document = json.loads(body)
            except ValueError:
                return False
            if not isinstance(document, dict) or not isinstance(document.get("metadata"), dict):
                return False
            return document["metadata"].get("name") == wanted and document.get("type") in (
                None,
                "Opaque",
            )
        return False


def _query(query: str) -> dict[str, str]:
    return dict(parse_qsl(query, keep_blank_values=True))


@dataclass(frozen=True, slots=True)
class _Grant:
    """What one process may reach, as whom, until when, and its requests in progress."""

    own_namespace: str | None
    label: str
    identity: RunIdentity = AGENT
    #: The loop's clock when the credential stops working (None: when its block ends).
    expires: float | None = None
    tofu_state: TofuState | None = None
    requests: set[asyncio.Task[object]] = field(default_factory=set)


class CommandsGateway:
    """A loopback endpoint relaying commands' API requests under :func:`refusal`.

    Started by the first :meth:`kubeconfig`; :meth:`close` stops it.
    """

    def __init__(
        self,
        kube: KubeApi,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        advertised: str | None = None,
    ) -> None:
        self._kube = kube
        self._host = host
        self._port = port
        #: The host a run's kubeconfig names (a Job's pod reaches the agent's pod IP).
        self._advertised = advertised or host
        self._grants: dict[str, _Grant] = {}
        self._runner: web.AppRunner | None = None
        self._url = ""
        self._starting = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def kubeconfig(
        self,
        directory: Path,
        *,
        own_namespace: str | None,
        label: str,
        identity: RunIdentity = AGENT,
        expires: float | None = None,
        tofu_state: TofuState | None = None,
    ) -> AsyncIterator[Path]:
        """A kubeconfig file in ``directory`` for one process, good until the block ends.

        Its token acts as ``identity`` only, and stops working at ``expires``
        (the loop's clock) if that comes first.
        """
        async with self.credential(
            own_namespace=own_namespace,
            label=label,
            identity=identity,
            expires=expires,
            tofu_state=tofu_state,
        ) as token:
            path = directory / f"kubeconfig-{secrets.token_hex(4)}.json"
            try:
                # JSON is YAML: client-go reads it as a kubeconfig.
                create_private_file(path, json.dumps(_kubeconfig(self.url, token)).encode())
                yield path
            finally:
                path.unlink(missing_ok=True)

    @contextlib.asynccontextmanager
    async def credential(
        self,
        *,
        own_namespace: str | None,
        label: str,
        identity: RunIdentity = AGENT,
        expires: float | None = None,
        tofu_state: TofuState | None = None,
    ) -> AsyncIterator[str]:
        """A bearer token for this gateway, good until the block ends (or ``expires``)."""
        await self._start()
        token = secrets.token_urlsafe(32)
        key = _key(token)
        self._grants[key] = _Grant(own_namespace, label, identity, expires, tofu_state)
        try:
            yield token
        finally:
            grant = self._grants.pop(key)
            # What a descendant still has in progress ends with the grant.
            for task in grant.requests:
                task.cancel()

    @property
    def url(self) -> str:
        """Where runs reach the gateway (once started)."""
        return self._url

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
            site = web.TCPSite(runner, self._host, self._port)
            await site.start()
            port = runner.addresses[0][1]
            self._runner = runner
            self._url = f"http://{self._advertised}:{port}"
            logger.info("commands' API gateway on %s", self._url)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        grant = self._grants.get(_key(_bearer(request.headers.get("Authorization", ""))))
        now = asyncio.get_running_loop().time()
        if grant is not None and grant.expires is not None and now >= grant.expires:
            grant = None
        if grant is None:
            return _status(
                401,
                "Unauthorized",
                "this gateway serves the agent's command runs only, while they run",
            )
        target = request.raw_path
        state = grant.tofu_state
        # The state's Secret or Lease may be in the agent's namespace: judged with the body.
        maybe_state = state is not None and state.concerns(request.method, target)
        why = refusal(
            request.method, target, request.headers, None if maybe_state else grant.own_namespace
        )
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
            identity = grant.identity
            if state is not None and maybe_state:
                if state.allows(request.method, target, body):
                    identity = AGENT  # the run's own state, kept by the agent
                elif state.namespace == grant.own_namespace:
                    why = str(own_namespace_error(state.namespace, target.partition("?")[0]))
                    return _status(403, "Forbidden", why)
            return await self._relay(request, target, body, identity)
        finally:
            grant.requests.discard(task)

    async def _relay(
        self, request: web.Request, target: str, body: bytes, identity: RunIdentity
    ) -> web.StreamResponse:
        # Pairs, not a dict: a header sent twice (Accept, say) goes on twice.
        headers = [
            (name, value)
            for name, value in request.headers.items()
            if name.lower() not in _NOT_RELAYED
        ]
        authorization = await self._kube.authorization()
        if authorization is not None:
            headers.append(("Authorization", authorization))
        headers.extend(identity.headers())
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
