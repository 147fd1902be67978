"""Server-side printing: ``meta.k8s.io/v1`` Tables, as ``kubectl get`` asks for them.

Columns and cells follow the API server's printers (``NAME READY STATUS
RESTARTS AGE`` for pods, ...); ages are written with apimachinery's
``HumanDuration``. Kinds without a printer get the default ``Name, Created
At`` table. Each row carries the object's metadata (``PartialObjectMetadata``)
or the whole object, as ``includeObject`` asks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from tests.kubestub.kinds import ResourceKind

__all__ = ["human_duration", "partial_metadata", "table", "table_content_type"]

table_content_type = "application/json;as=Table;v=v1;g=meta.k8s.io"

Column = tuple[str, str, int]  # name, type, priority
Row = Callable[[dict[str, Any]], list[Any]]


def human_duration(seconds: float) -> str:
    """apimachinery's ``duration.HumanDuration``: 5s, 2m30s, 3h, 4d5h, 2y ..."""
    whole = int(seconds)
    if whole < -1:
        return "<invalid>"
    if whole < 0:
        return "0s"
    if whole < 120:
        return f"{whole}s"
    minutes = whole // 60
    if minutes < 10:
        rest = whole % 60
        return f"{minutes}m" if rest == 0 else f"{minutes}m{rest}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = whole // 3600
    if hours < 8:
        rest = minutes % 60
        return f"{hours}h" if rest == 0 else f"{hours}h{rest}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rest = hours % 24
        return f"{hours // 24}d" if rest == 0 else f"{hours // 24}d{rest}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        rest = (hours // 24) % 365
        years = hours // 24 // 365
        return f"{years}y" if rest == 0 else f"{years}y{rest}d"
    return f"{hours // 24 // 365}y"


def _age(timestamp: Any) -> str:
    if not isinstance(timestamp, str) or not timestamp:
        return "<unknown>"
    try:
        moment = datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return "<unknown>"
    return human_duration((datetime.now(UTC) - moment).total_seconds())


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _created(obj: dict[str, Any]) -> str:
    return _age(_meta(obj).get("creationTimestamp"))


def _none(value: Any) -> Any:
    return "<none>" if value in (None, "", []) else value


def _pod_row(obj: dict[str, Any]) -> list[Any]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    statuses = status.get("containerStatuses") or []
    total = len(spec.get("containers") or [])
    ready = sum(1 for s in statuses if s.get("ready"))
    restarts = sum(int(s.get("restartCount", 0)) for s in statuses)
    reason = status.get("reason") or status.get("phase") or "Pending"
    for container in statuses:
        state = container.get("state") or {}
        waiting = (state.get("waiting") or {}).get("reason")
        terminated = state.get("terminated") or {}
        if waiting:
            reason = waiting
        elif terminated:
            reason = terminated.get("reason") or f"ExitCode:{terminated.get('exitCode', 0)}"
    if _meta(obj).get("deletionTimestamp"):
        reason = "Terminating"
    gates = spec.get("readinessGates") or []
    return [
        _meta(obj).get("name"),
        f"{ready}/{total}",
        reason,
        str(restarts),
        _created(obj),
        _none(status.get("podIP")),
        _none(spec.get("nodeName")),
        _none(status.get("nominatedNodeName")),
        f"0/{len(gates)}" if gates else "<none>",
    ]


def _containers(template: dict[str, Any]) -> tuple[str, str]:
    containers = (template.get("spec") or {}).get("containers") or []
    names = ",".join(str(c.get("name", "")) for c in containers)
    images = ",".join(str(c.get("image", "")) for c in containers)
    return names, images


def _match_labels(spec: dict[str, Any]) -> str:
    labels = (spec.get("selector") or {}).get("matchLabels") or {}
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "<none>"


def _deployment_row(obj: dict[str, Any]) -> list[Any]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    names, images = _containers(spec.get("template") or {})
    return [
        _meta(obj).get("name"),
        f"{status.get('readyReplicas', 0)}/{spec.get('replicas', 1)}",
        status.get("updatedReplicas", 0),
        status.get("availableReplicas", 0),
        _created(obj),
        names,
        images,
        _match_labels(spec),
    ]


def _job_row(obj: dict[str, Any]) -> list[Any]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    if conditions.get("Complete") == "True":
        state = "Complete"
    elif conditions.get("Failed") == "True":
        state = "Failed"
    elif spec.get("suspend"):
        state = "Suspended"
    else:
        state = "Running"
    duration = _age(status.get("startTime")) if status.get("startTime") else ""
    names, images = _containers(spec.get("template") or {})
    return [
        _meta(obj).get("name"),
        state,
        f"{status.get('succeeded', 0)}/{spec.get('completions', 1)}",
        duration,
        _created(obj),
        names,
        images,
        _match_labels(spec),
    ]


def _service_row(obj: dict[str, Any]) -> list[Any]:
    spec = obj.get("spec") or {}
    ports = ",".join(
        f"{p.get('port')}{':' + str(p['nodePort']) if p.get('nodePort') else ''}/"
        f"{p.get('protocol', 'TCP')}"
        for p in spec.get("ports") or []
    )
    selector = ",".join(f"{k}={v}" for k, v in sorted((spec.get("selector") or {}).items()))
    external = ",".join(spec.get("externalIPs") or []) or (
        "<pending>" if spec.get("type") == "LoadBalancer" else "<none>"
    )
    return [
        _meta(obj).get("name"),
        spec.get("type", "ClusterIP"),
        _none(spec.get("clusterIP")),
        external,
        ports or "<none>",
        _created(obj),
        selector or "<none>",
    ]


def _event_row(obj: dict[str, Any]) -> list[Any]:
    involved = obj.get("involvedObject") or {}
    source = obj.get("source") or {}
    last = obj.get("lastTimestamp") or obj.get("eventTime") or _meta(obj).get("creationTimestamp")
    first = obj.get("firstTimestamp") or last
    return [
        _age(last),
        obj.get("type", ""),
        obj.get("reason", ""),
        f"{str(involved.get('kind', '')).lower()}/{involved.get('name', '')}",
        involved.get("fieldPath", ""),
        ", ".join(str(v) for v in (source.get("component"), source.get("host")) if v),
        obj.get("message", ""),
        _age(first),
        obj.get("count", 1),
        _meta(obj).get("name"),
    ]


_PRINTERS: dict[str, tuple[list[Column], Row]] = {
    "pods": (
        [
            ("Name", "string", 0),
            ("Ready", "string", 0),
            ("Status", "string", 0),
            ("Restarts", "string", 0),
            ("Age", "string", 0),
            ("IP", "string", 1),
            ("Node", "string", 1),
            ("Nominated Node", "string", 1),
            ("Readiness Gates", "string", 1),
        ],
        _pod_row,
    ),
    "deployments": (
        [
            ("Name", "string", 0),
            ("Ready", "string", 0),
            ("Up-to-date", "string", 0),
            ("Available", "string", 0),
            ("Age", "string", 0),
            ("Containers", "string", 1),
            ("Images", "string", 1),
            ("Selector", "string", 1),
        ],
        _deployment_row,
    ),
    "jobs": (
        [
            ("Name", "string", 0),
            ("Status", "string", 0),
            ("Completions", "string", 0),
            ("Duration", "string", 0),
            ("Age", "string", 0),
            ("Containers", "string", 1),
            ("Images", "string", 1),
            ("Selector", "string", 1),
        ],
        _job_row,
    ),
    "services": (
        [
            ("Name", "string", 0),
            ("Type", "string", 0),
            ("Cluster-IP", "string", 0),
            ("External-IP", "string", 0),
            ("Port(s)", "string", 0),
            ("Age", "string", 0),
            ("Selector", "string", 1),
        ],
        _service_row,
    ),
    "configmaps": (
        [("Name", "string", 0), ("Data", "integer", 0), ("Age", "string", 0)],
        lambda o: [
            _meta(o).get("name"),
            len(o.get("data") or {}) + len(o.get("binaryData") or {}),
            _created(o),
        ],
    ),
    "secrets": (
        [
            ("Name", "string", 0),
            ("Type", "string", 0),
            ("Data", "integer", 0),
            ("Age", "string", 0),
        ],
        lambda o: [
            _meta(o).get("name"),
            o.get("type", "Opaque"),
            len(o.get("data") or {}),
            _created(o),
        ],
    ),
    "namespaces": (
        [("Name", "string", 0), ("Status", "string", 0), ("Age", "string", 0)],
        lambda o: [_meta(o).get("name"), (o.get("status") or {}).get("phase", ""), _created(o)],
    ),
    "serviceaccounts": (
        [("Name", "string", 0), ("Secrets", "string", 0), ("Age", "string", 0)],
        lambda o: [_meta(o).get("name"), len(o.get("secrets") or []), _created(o)],
    ),
    "events": (
        [
            ("Last Seen", "string", 0),
            ("Type", "string", 0),
            ("Reason", "string", 0),
            ("Object", "string", 0),
            ("Subobject", "string", 1),
            ("Source", "string", 1),
            ("Message", "string", 0),
            ("First Seen", "string", 1),
            ("Count", "string", 1),
            ("Name", "string", 1),
        ],
        _event_row,
    ),
}

_DEFAULT: tuple[list[Column], Row] = (
    [("Name", "string", 0), ("Created At", "date", 0)],
    lambda o: [_meta(o).get("name"), _meta(o).get("creationTimestamp")],
)


def partial_metadata(obj: dict[str, Any]) -> dict[str, Any]:
    """The object reduced to ``PartialObjectMetadata`` (kind, apiVersion, metadata)."""
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": _meta(obj),
    }


def table(
    kind: ResourceKind,
    objects: Iterable[dict[str, Any]],
    *,
    resource_version: str,
    include_object: str = "Metadata",
    continue_token: str = "",
    remaining: int | None = None,
    headers: bool = True,
) -> dict[str, Any]:
    """A Table of ``objects``; ``include_object`` is ``None``, ``Metadata`` or ``Object``."""
    columns, row = _PRINTERS.get(kind.plural, _DEFAULT)
    rows = []
    for obj in objects:
        entry: dict[str, Any] = {"cells": row(obj)}
        if include_object == "Object":
            entry["object"] = obj
        elif include_object != "None":
            entry["object"] = partial_metadata(obj)
        rows.append(entry)
    meta: dict[str, Any] = {"resourceVersion": resource_version}
    if continue_token:
        meta["continue"] = continue_token
    if remaining is not None:
        meta["remainingItemCount"] = remaining
    definitions = [
        {
            "name": name,
            "type": kind_,
            "format": "name" if name == "Name" and priority == 0 else "",
            "description": f"{name} of the {kind.singular}",
            "priority": priority,
        }
        for name, kind_, priority in columns
    ]
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": definitions if headers else None,
        "rows": rows,
    }
