"""Run ``type: query``: read objects, events, logs or endpoints, as a bounded result.

The result goes back to the control plane, so it is cut to
:data:`MAX_RESULT_BYTES` (lists keep their first items, logs their first
lines, ``"truncated": true`` marks the cut) and Secrets are never shown:
their data values read ``<redacted>``. ``managedFields`` are dropped as noise.

Like every command, a query reads nothing in the agent's own namespace
(:meth:`~.context.ExecutionContext.check_not_own`; docs/security.md,
"Commands"). It runs with the agent's ServiceAccount, not as its submitter,
and that namespace holds the agent's key, command journal and bootstrap token:
even redacted, their names and keys, the agent's Pod and its log are not for
whoever may dispatch a query. A query that names that namespace (or reads
its Namespace object) is refused; a list across every namespace leaves it
out, and says so (``"excludedNamespace"``).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from tunnel_commands import DescribeQuery, EndpointsQuery, GetQuery, LogsQuery, QuerySpec

from .errors import ExecutorError, KubeRequestError
from .kube import ApiResource
from .steps import Step, StepReport

__all__ = ["MAX_RESULT_BYTES", "REDACTED", "clean_object", "run_query"]

MAX_RESULT_BYTES = (1 << 20) - 8192
REDACTED = "<redacted>"
_EVENTS = ApiResource("", "v1", "Event", "events", namespaced=True)
_SERVICES = ApiResource("", "v1", "Service", "services", namespaced=True)
_PODS = ApiResource("", "v1", "Pod", "pods", namespaced=True)
_MAX_EVENTS = 100
_LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def _size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), default=str))


def clean_object(obj: dict[str, Any], resource: ApiResource) -> dict[str, Any]:
    """``obj`` (of ``resource``) without managedFields, and without a Secret's values.

    The kind comes from the resource, not the object: the items of a list
    carry no ``kind``.
    """
    result = copy.deepcopy(obj)
    metadata = result.get("metadata")
    if isinstance(metadata, dict):
        metadata.pop("managedFields", None)
    if (resource.group, resource.kind) == ("", "Secret"):
        for field in ("data", "stringData"):
            if isinstance(result.get(field), dict):
                result[field] = dict.fromkeys(result[field], REDACTED)
        annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
        if isinstance(annotations, dict) and _LAST_APPLIED in annotations:
            annotations[_LAST_APPLIED] = REDACTED
    return result


def _fit_items(items: list[dict[str, Any]], budget: int) -> tuple[list[dict[str, Any]], bool]:
    kept: list[dict[str, Any]] = []
    used = 0
    for item in items:
        used += _size(item) + 1
        if used > budget:
            return kept, True
        kept.append(item)
    return kept, False


def _fit_object(obj: dict[str, Any]) -> dict[str, Any]:
    if _size(obj) <= MAX_RESULT_BYTES:
        return {"object": obj}
    metadata = obj.get("metadata") or {}
    stub = {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": {key: metadata.get(key) for key in ("name", "namespace", "uid")},
    }
    return {"object": stub, "truncated": True}


async def run_query(spec: QuerySpec, step: Step) -> StepReport:
    query = spec.query
    where = step.path_of(query.OPERATION)
    # Refused before any request is made (docs/security.md, "Commands").
    step.context.check_not_own(query.namespace, f"{where}.namespace")
    if isinstance(query, DescribeQuery):
        result = await _describe(query, step, where)
    elif isinstance(query, GetQuery):
        result = await _get(query, step, where)
    elif isinstance(query, LogsQuery):
        result = await _logs(query, step, where)
    else:
        result = await _endpoints(query, step, where)
    return StepReport({"query": query.OPERATION, "result": result})


def _is_namespace(resource: ApiResource) -> bool:
    return (resource.group, resource.plural) == ("", "namespaces")


def _outside_own(
    items: list[dict[str, Any]], step: Step
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A list across every namespace without what is in the agent's own, and a note saying so.

    The note is there whether or not anything was left out: it tells the
    reader why the agent's namespace is missing, and nothing of what it holds.
    """
    own = step.context.own_namespace
    if own is None:
        return items, {}
    kept = [item for item in items if (item.get("metadata") or {}).get("namespace") != own]
    return kept, {"excludedNamespace": own}


async def _resource(query: GetQuery, step: Step, where: str) -> ApiResource:
    try:
        resource = await step.client.resource(query.api_version, query.kind)
    except KubeRequestError as exc:
        raise ExecutorError(f"{where}: cannot discover {query.api_version}: {exc.detail}") from exc
    if resource is None:
        raise ExecutorError(
            f"{where}.kind: the cluster serves no kind {query.kind} in {query.api_version}"
        )
    if resource.namespaced and query.name and not query.namespace:
        raise ExecutorError(f"{where}.namespace: required for the namespaced {query.kind}")
    if _is_namespace(resource) and query.name is not None:
        # The Namespace object itself, as the commands' gateway refuses it.
        step.context.check_not_own(query.name, f"{where}.name")
    return resource


async def _read(
    step: Step, resource: ApiResource, namespace: str | None, name: str, where: str
) -> Any:
    try:
        return await step.client.get(resource, namespace, name)
    except KubeRequestError as exc:
        place = f"{namespace}/{name}" if namespace and resource.namespaced else name
        if exc.status == 404:
            raise ExecutorError(f"{where}: {resource.kind} {place} not found") from exc
        raise ExecutorError(f"{where}: cannot read {resource.kind} {place}: {exc.detail}") from exc


async def _list(
    step: Step, resource: ApiResource, namespace: str | None, where: str, **selectors: str | None
) -> list[dict[str, Any]]:
    try:
        return await step.client.list(resource, namespace, **selectors)
    except KubeRequestError as exc:
        raise ExecutorError(f"{where}: cannot list {resource.plural}: {exc.detail}") from exc


async def _get(query: GetQuery, step: Step, where: str) -> dict[str, Any]:
    resource = await _resource(query, step, where)
    if query.name is not None:
        obj = await _read(step, resource, query.namespace, query.name, where)
        return _fit_object(clean_object(obj, resource))
    items = await _list(step, resource, query.namespace, where, label_selector=query.label_selector)
    note: dict[str, Any] = {}
    if resource.namespaced and query.namespace is None:
        items, note = _outside_own(items, step)
    kept, truncated = _fit_items(
        [clean_object(item, resource) for item in items], MAX_RESULT_BYTES - 256
    )
    return {"items": kept, "count": len(items), "truncated": truncated} | note


async def _describe(query: DescribeQuery, step: Step, where: str) -> dict[str, Any]:
    resource = await _resource(query, step, where)
    assert query.name is not None
    obj = clean_object(await _read(step, resource, query.namespace, query.name, where), resource)
    selector = f"involvedObject.name={query.name},involvedObject.kind={query.kind}"
    namespace = query.namespace if resource.namespaced else "default"
    if resource.namespaced:
        selector += f",involvedObject.namespace={query.namespace}"
    note: dict[str, Any] = {}
    if namespace == step.context.own_namespace:
        # A cluster-scoped object's events are in "default": not read if that is the agent's.
        events, note = [], {"excludedNamespace": namespace}
    else:
        events = await _list(step, _EVENTS, namespace, where, field_selector=selector)
    events.sort(key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    listed = [
        {
            "type": event.get("type"),
            "reason": event.get("reason"),
            "message": event.get("message"),
            "count": event.get("count"),
            "firstTimestamp": event.get("firstTimestamp"),
            "lastTimestamp": event.get("lastTimestamp") or event.get("eventTime"),
            "source": (event.get("source") or {}).get("component"),
        }
        for event in events[-_MAX_EVENTS:]
    ]
    kept, truncated = _fit_items(listed, MAX_RESULT_BYTES // 4)
    result = _fit_object(obj) | {"events": kept} | note
    if truncated:
        result["truncated"] = True
    return result


async def _logs(query: LogsQuery, step: Step, where: str) -> dict[str, Any]:
    params = {"limitBytes": str(MAX_RESULT_BYTES + 1)}
    for key, value in (
        ("container", query.container),
        ("tailLines", query.tail_lines),
        ("sinceSeconds", query.since_seconds),
    ):
        if value is not None:
            params[key] = str(value)
    path = _PODS.path(query.namespace, query.pod) + "/log"
    try:
        data = await step.client.request_bytes(
            "GET", path, params=params, max_bytes=MAX_RESULT_BYTES + 1, accept="*/*"
        )
    except KubeRequestError as exc:
        if exc.status == 404:
            raise ExecutorError(f"{where}: pod {query.namespace}/{query.pod} not found") from exc
        raise ExecutorError(f"{where}: cannot read the log: {exc.detail}") from exc
    truncated = len(data) > MAX_RESULT_BYTES
    if truncated:
        data = data[:MAX_RESULT_BYTES]
        data = data[: data.rfind(b"\n") + 1] or data
    text = data.decode("utf-8", "replace")
    return {"log": text, "lines": text.count("\n"), "truncated": truncated}


async def _endpoints(query: EndpointsQuery, step: Step, where: str) -> dict[str, Any]:
    service = await _read(step, _SERVICES, query.namespace, query.service, where)
    spec = service.get("spec") or {}
    result: dict[str, Any] = {
        "service": {
            "name": query.service,
            "namespace": query.namespace,
            "type": spec.get("type"),
            "clusterIP": spec.get("clusterIP"),
            "ports": spec.get("ports") or [],
        }
    }
    try:
        slices = await step.client.resource("discovery.k8s.io/v1", "EndpointSlice")
    except KubeRequestError as exc:
        raise ExecutorError(f"{where}: cannot discover EndpointSlices: {exc.detail}") from exc
    endpoints: list[dict[str, Any]] = []
    if slices is not None:
        result["source"] = "EndpointSlice"
        selector = f"kubernetes.io/service-name={query.service}"
        for item in await _list(step, slices, query.namespace, where, label_selector=selector):
            for endpoint in item.get("endpoints") or []:
                conditions = endpoint.get("conditions") or {}
                target = endpoint.get("targetRef") or {}
                endpoints.append(
                    {
                        "addresses": endpoint.get("addresses") or [],
                        "ready": conditions.get("ready") is not False,
                        "node": endpoint.get("nodeName"),
                        "pod": target.get("name") if target.get("kind") == "Pod" else None,
                        "ports": item.get("ports") or [],
                    }
                )
    else:
        # A cluster without EndpointSlices: the pods the selector picks, as kube-proxy would.
        result["source"] = "pods"
        selector_map = spec.get("selector") or {}
        if selector_map:
            selector = ",".join(f"{key}={value}" for key, value in sorted(selector_map.items()))
            pods = await _list(step, _PODS, query.namespace, where, label_selector=selector)
            for pod in pods:
                status = pod.get("status") or {}
                ready = any(
                    c.get("type") == "Ready" and c.get("status") == "True"
                    for c in status.get("conditions") or []
                )
                endpoints.append(
                    {
                        "addresses": [status["podIP"]] if status.get("podIP") else [],
                        "ready": ready,
                        "node": (pod.get("spec") or {}).get("nodeName"),
                        "pod": (pod.get("metadata") or {}).get("name"),
                    }
                )
    kept, truncated = _fit_items(endpoints, MAX_RESULT_BYTES // 2)
    result["endpoints"] = kept
    if truncated:
        result["truncated"] = True
    return result
