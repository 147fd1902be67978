"""A stand-in Kubernetes API server for tests and the demo: real kubectl 1.32 works against it.

It is test support, not shipped: it lives under ``tests/`` and may depend on
aiohttp, PyYAML, the standard library and :mod:`tunnel_pki` (for its CA and
serving certificate), nothing else of the project. Start one with
``async with KubeStub() as stub:`` (or ``python -m tests.kubestub``); see
:class:`~tests.kubestub.server.KubeStub` for what tests inspect and configure.

Modules, one concept each:

- :mod:`~tests.kubestub.server`: the aiohttp app and :class:`KubeStub` (TLS, kubeconfig)
- :mod:`~tests.kubestub.state`: everything one stand-in cluster holds
- :mod:`~tests.kubestub.kinds`: the resource types served
- :mod:`~tests.kubestub.store`: objects, resourceVersions, watch fan-out
- :mod:`~tests.kubestub.admission`: validation, defaults, the kubelet's and controllers' part
- :mod:`~tests.kubestub.controllers`: pods for deployments and jobs, garbage collection
- :mod:`~tests.kubestub.jobrunner`: Job pods run as local processes (when switched on)
- :mod:`~tests.kubestub.resources`: routing and the REST verbs
- :mod:`~tests.kubestub.watch`: watch streams
- :mod:`~tests.kubestub.patch`: merge, strategic merge and JSON patches
- :mod:`~tests.kubestub.apply`: server-side apply and managedFields
- :mod:`~tests.kubestub.selectors`: label and field selectors
- :mod:`~tests.kubestub.negotiation`: Accept headers: JSON, Table, metadata
- :mod:`~tests.kubestub.tables`: server-side printing
- :mod:`~tests.kubestub.discovery`: /version, /api, /apis (legacy and aggregated), OpenAPI v3
- :mod:`~tests.kubestub.auth`: tokens, impersonation, policy, request log, access reviews
- :mod:`~tests.kubestub.status`: Status bodies
- :mod:`~tests.kubestub.httpio`: bounded request bodies, JSON responses
- :mod:`~tests.kubestub.protobuf`: the protobuf bodies kubectl's typed clients send
- :mod:`~tests.kubestub.logs`: container logs
- :mod:`~tests.kubestub.podfs`: per-pod in-memory filesystems
- :mod:`~tests.kubestub.commands`: the fake processes exec runs
- :mod:`~tests.kubestub.exec`: exec and attach over WebSockets (v5/v4.channel.k8s.io)
- :mod:`~tests.kubestub.spdy`: SPDY/3.1 framing
- :mod:`~tests.kubestub.portforward`: port-forward (SPDY over WebSocket, and channels)
"""

from tests.kubestub.auth import ADMIN, Policy, RecordedRequest, RequestLog, Rule, UserInfo
from tests.kubestub.podfs import FileSystem
from tests.kubestub.server import KubeStub, create_app
from tests.kubestub.state import ClusterState, StubSettings
from tests.kubestub.store import Store, WatchEvent

__all__ = [
    "ADMIN",
    "ClusterState",
    "FileSystem",
    "KubeStub",
    "Policy",
    "RecordedRequest",
    "RequestLog",
    "Rule",
    "Store",
    "StubSettings",
    "UserInfo",
    "WatchEvent",
    "create_app",
]
