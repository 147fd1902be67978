"""Everything one stand-in cluster holds, behind the aiohttp app key :data:`STATE`.

The store, the tokens, the access policy, the request log, container logs,
pod filesystems and where each pod port forwards to. Tests reach it through
:class:`tests.kubestub.server.KubeStub`; handlers through ``request.app[STATE]``.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tests.kubestub.admission import prepare_create
from tests.kubestub.auth import Authenticator, Policy, RequestLog
from tests.kubestub.controllers import WorkloadController
from tests.kubestub.jobrunner import JobPods
from tests.kubestub.kinds import require_kind
from tests.kubestub.logs import LogBook
from tests.kubestub.podfs import PodFiles
from tests.kubestub.store import Store, WatchEvent

__all__ = ["STATE", "ClusterState", "StubSettings"]

PODS = require_kind("", "v1", "pods")
NAMESPACES = require_kind("", "v1", "namespaces")
SERVICES = require_kind("", "v1", "services")


@dataclass(frozen=True, slots=True)
class StubSettings:
    """Bounds and timings of one stand-in."""

    history: int = 1000
    """How many watch events are kept for watches that resume from a resourceVersion."""
    watch_queue_size: int = 1000
    """Events a watcher may fall behind before it is closed."""
    bookmark_interval: float = 60.0
    """Seconds between BOOKMARK events on watches that allow them."""
    max_watch_seconds: float = 1800.0
    """The longest a watch lasts (``timeoutSeconds`` may ask for less)."""
    log_lines: int = 10_000
    """Lines kept per container log."""
    request_log: int = 10_000
    """Requests kept in the request log."""
    max_ws_message: int = 4 * 1024 * 1024
    """The largest WebSocket message accepted on exec and port-forward."""
    aggregated_discovery: bool = True
    """Serve aggregated discovery (``apidiscovery.k8s.io/v2``); False: legacy documents only."""


class ClusterState:
    """The cluster behind one stand-in."""

    def __init__(self, settings: StubSettings | None = None) -> None:
        self.settings = settings or StubSettings()
        self.store = Store(
            history=self.settings.history, watch_queue_size=self.settings.watch_queue_size
        )
        self.authenticator = Authenticator()
        self.policy = Policy()
        self.requests = RequestLog(self.settings.request_log)
        self.logs = LogBook(self.settings.log_lines)
        self.files = PodFiles()
        self.port_targets: dict[tuple[str, str, int], tuple[str, int]] = {}
        self.default_port_target: tuple[str, int] | None = None
        self.sockets: weakref.WeakSet[web.WebSocketResponse] = weakref.WeakSet()
        """Open exec and port-forward sockets, closed when the server stops."""
        self.store.listeners.append(self._on_event)
        self.controller = WorkloadController(self.store)
        #: Job pods run as local processes, when switched on (``jobs.enabled``).
        self.jobs = JobPods(self.store, self.logs)
        for name in ("default", "kube-system", "kube-public", "kube-node-lease"):
            namespace = prepare_create(NAMESPACES, {"metadata": {"name": name}}, "")
            self.store.create(NAMESPACES, namespace)
        kubernetes = {
            "metadata": {"name": "kubernetes", "labels": {"component": "apiserver"}},
            "spec": {
                "clusterIP": "10.96.0.1",
                "ports": [{"name": "https", "port": 443, "targetPort": 6443}],
            },
        }
        self.store.create(SERVICES, prepare_create(SERVICES, kubernetes, "default"))

    def _on_event(self, event: WatchEvent) -> None:
        if event.kind is PODS and event.type == "DELETED":
            uid = event.obj["metadata"]["uid"]
            self.logs.forget(uid)
            self.files.forget(uid)

    def port_target(self, namespace: str, pod: str, port: int) -> tuple[str, int] | None:
        """Where a connection to ``pod``'s ``port`` goes (None: nothing listens there)."""
        return self.port_targets.get((namespace, pod, port), self.default_port_target)

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        """A pod (NotFound if missing)."""
        return self.store.get(PODS, namespace, name)


STATE = web.AppKey("kubestub_state", ClusterState)
"""The app key under which the app holds its :class:`ClusterState`."""
