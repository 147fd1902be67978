"""The stand-in API server: the aiohttp app and :class:`KubeStub`, which runs it on TLS.

Every request is recorded (method, path, every header), authenticated by
bearer token, impersonated per its ``Impersonate-*`` headers, authorized by
the policy, and answered by discovery, OpenAPI or the resource API. Errors
are ``metav1.Status`` bodies with the real server's codes and wording.

:class:`KubeStub` makes its own CA and serving certificate (ALPN
``http/1.1`` only, never h2), a token for its admin user, a kubeconfig for
clients, and a TCP echo server that pod ports forward to unless told
otherwise.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from tests.kubestub.admission import prepare_create
from tests.kubestub.auth import (
    ADMIN,
    RECORD,
    Policy,
    RecordedRequest,
    RequestLog,
    UserInfo,
    impersonate,
)
from tests.kubestub.discovery import handle_discovery, handle_openapi
from tests.kubestub.httpio import MAX_BODY, json_response
from tests.kubestub.jobrunner import JobPods
from tests.kubestub.kinds import KINDS, ResourceKind
from tests.kubestub.podfs import FileSystem
from tests.kubestub.resources import handle_resource, parse_api_path
from tests.kubestub.state import STATE, ClusterState, StubSettings
from tests.kubestub.status import ApiError, bad_request, path_not_found
from tests.kubestub.store import Store
from tunnel_pki.ca import CertificateAuthority
from tunnel_pki.tls import server_context

__all__ = ["KubeStub", "create_app"]

logger = logging.getLogger(__name__)


async def _handle(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    entry = state.requests.record(request)
    try:
        return await _dispatch(request, state, entry)
    except ApiError as exc:
        return json_response(exc.body(), exc.code)


async def _note_status(request: web.Request, response: web.StreamResponse) -> None:
    """Record the status as the response starts (streams and upgrades included)."""
    if RECORD in request:
        request[RECORD].status = response.status


async def _dispatch(
    request: web.Request, state: ClusterState, entry: RecordedRequest
) -> web.StreamResponse:
    parts = [part for part in request.path.split("/") if part]
    if parts in (["healthz"], ["livez"], ["readyz"]):
        return web.Response(text="ok")
    user = state.authenticator.authenticate(request)
    user = impersonate(request, user, state.policy)
    entry.user = user
    if parts[:1] == ["openapi"]:
        _only_get(request)
        return handle_openapi(request, parts)
    discovered = handle_discovery(request, parts, aggregated=state.settings.aggregated_discovery)
    if discovered is not None:
        _only_get(request)
        return discovered
    path = parse_api_path(parts)
    if path is None:
        raise path_not_found()
    return await handle_resource(request, state, user, path)


def _only_get(request: web.Request) -> None:
    if request.method not in ("GET", "HEAD"):
        raise ApiError(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )


async def _on_shutdown(app: web.Application) -> None:
    state = app[STATE]
    state.store.close()
    state.logs.close_all()
    for socket in list(state.sockets):
        await socket.close()


def create_app(state: ClusterState) -> web.Application:
    """The stand-in's aiohttp application, serving ``state``."""
    app = web.Application(client_max_size=MAX_BODY)
    app[STATE] = state
    app.router.add_route("*", "/{tail:.*}", _handle)
    app.on_response_prepare.append(_note_status)
    app.on_shutdown.append(_on_shutdown)
    return app


class KubeStub:
    """A stand-in Kubernetes API server on ``https://127.0.0.1:<port>``.

    Use as ``async with KubeStub() as stub:`` (or :meth:`start` / :meth:`stop`).
    The attributes tests use: :attr:`url`, :attr:`ca_pem`, :attr:`token`,
    :meth:`kubeconfig`, :attr:`store`, :attr:`policy`, :attr:`requests`, and
    the helpers below (:meth:`add`, :meth:`append_log`, :meth:`deny` ...).
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        settings: StubSettings | None = None,
    ) -> None:
        self.host = host
        self._port = port
        self.state = ClusterState(settings)
        self.ca = CertificateAuthority.create("kubestub CA")
        self._issued = self.ca.issue_server_certificate([host, "localhost"], timedelta(days=2))
        self.token = self.state.authenticator.add_token(ADMIN)
        self._runner: web.AppRunner | None = None
        self._echo: asyncio.Server | None = None

    # Lifecycle

    async def start(self) -> None:
        """Start the echo server and the HTTPS server."""
        self._echo = await asyncio.start_server(_echo, "127.0.0.1", 0)
        echo_port = self._echo.sockets[0].getsockname()[1]
        self.state.default_port_target = ("127.0.0.1", echo_port)
        assert self._issued.key_pem is not None
        context = server_context(self._issued.cert_pem, self._issued.key_pem, self.ca.cert_pem)
        self._runner = web.AppRunner(
            create_app(self.state),
            handler_cancellation=True,
            shutdown_timeout=2.0,
            access_log=None,
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self._port, ssl_context=context)
        await site.start()
        self._port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        """Stop serving: watches, log follows and sockets end, then the listener closes."""
        await self.state.jobs.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._echo is not None:
            self._echo.close()
            await self._echo.wait_closed()
            self._echo = None

    async def __aenter__(self) -> KubeStub:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # Where and how to connect

    @property
    def port(self) -> int:
        """The TCP port it listens on (after :meth:`start`)."""
        return self._port

    @property
    def url(self) -> str:
        """``https://127.0.0.1:<port>``."""
        return f"https://{self.host}:{self._port}"

    @property
    def ca_pem(self) -> bytes:
        """The CA certificate that signed the serving certificate."""
        return self.ca.cert_pem

    def kubeconfig(self, *, token: str | None = None, namespace: str | None = None) -> str:
        """A kubeconfig (YAML) for this server with ``token`` (default: the admin token)."""
        context: dict[str, Any] = {"cluster": "kubestub", "user": "kubestub"}
        if namespace:
            context["namespace"] = namespace
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "kubestub",
                    "cluster": {
                        "server": self.url,
                        "certificate-authority-data": base64.b64encode(self.ca_pem).decode(),
                    },
                }
            ],
            "users": [{"name": "kubestub", "user": {"token": token or self.token}}],
            "contexts": [{"name": "kubestub", "context": context}],
            "current-context": "kubestub",
        }
        return yaml.safe_dump(config, sort_keys=False)

    def write_kubeconfig(self, path: Path, **options: Any) -> Path:
        """Write :meth:`kubeconfig` to ``path`` (mode 0600) and return it."""
        path.write_text(self.kubeconfig(**options))
        path.chmod(0o600)
        return path

    # What tests inspect and configure

    @property
    def store(self) -> Store:
        """Every object, with resourceVersions and watches."""
        return self.state.store

    @property
    def jobs(self) -> JobPods:
        """Job pods as local processes: ``stub.jobs.enabled = True``; ``stub.jobs.specs``."""
        return self.state.jobs

    @property
    def policy(self) -> Policy:
        """The access policy: ``stub.policy.deny("alice", "delete", "pods")``."""
        return self.state.policy

    @property
    def requests(self) -> RequestLog:
        """Every request received, with its headers and the identity it acted as."""
        return self.state.requests

    def add_token(self, user: str, groups: tuple[str, ...] = ("system:authenticated",)) -> str:
        """A new bearer token for ``user``."""
        return self.state.authenticator.add_token(UserInfo(user, groups))

    def deny(self, user: str = "*", verb: str = "*", resource: str = "*", **scope: str) -> None:
        """Forbid ``user`` to ``verb`` ``resource`` (see :meth:`Policy.deny`)."""
        self.state.policy.deny(user, verb, resource, **scope)

    def add(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create an object as a POST would (validated, defaulted, running if a pod)."""
        kind = _kind_of(obj)
        namespace = (
            (obj.get("metadata") or {}).get("namespace", "default") if kind.namespaced else ""
        )
        return self.state.store.create(kind, prepare_create(kind, obj, namespace))

    def add_pod(
        self, name: str, namespace: str = "default", *, containers: tuple[str, ...] = ("main",)
    ) -> dict[str, Any]:
        """Create a running pod with one ``busybox`` container per name in ``containers``."""
        return self.add(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
                "spec": {"containers": [{"name": c, "image": "busybox:1.36"} for c in containers]},
            }
        )

    def get(
        self, api_version: str, kind: str, name: str, namespace: str = ""
    ) -> dict[str, Any] | None:
        """An object by apiVersion, kind, name (and namespace), or None."""
        resource = _kind_of({"apiVersion": api_version, "kind": kind})
        return self.state.store.find(resource, namespace if resource.namespaced else "", name)

    def append_log(
        self, namespace: str, pod: str, text: str, *, container: str | None = None
    ) -> None:
        """Append a line (or lines) to a pod container's log; followers see it at once."""
        obj = self.state.pod(namespace, pod)
        name = container or obj["spec"]["containers"][0]["name"]
        self.state.logs.append(obj["metadata"]["uid"], name, text)

    def close_log(self, namespace: str, pod: str, *, container: str | None = None) -> None:
        """End a container's log (as when it exits): ``logs -f`` returns."""
        obj = self.state.pod(namespace, pod)
        self.state.logs.close(obj["metadata"]["uid"], container)

    def pod_files(self, namespace: str, pod: str) -> FileSystem:
        """The in-memory filesystem that exec commands of ``pod`` see."""
        obj = self.state.pod(namespace, pod)
        return self.state.files.of(obj["metadata"]["uid"], pod)

    def set_port_target(self, namespace: str, pod: str, port: int, host: str, target: int) -> None:
        """Make connections to ``pod``'s ``port`` go to ``host:target``."""
        self.state.port_targets[(namespace, pod, port)] = (host, target)


def _kind_of(obj: dict[str, Any]) -> ResourceKind:
    api_version = str(obj.get("apiVersion", ""))
    group, _, version = api_version.rpartition("/")
    for kind in KINDS:
        if (kind.group, kind.version, kind.kind) == (group, version, obj.get("kind")):
            return kind
    raise bad_request(f"no kind {obj.get('kind')!r} in {api_version!r} is served")


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A TCP echo service: what a pod port answers unless told otherwise."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass  # The forwarded connection was reset: the echo simply ends.
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
