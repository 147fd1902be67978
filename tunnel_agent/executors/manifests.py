"""Run ``type: manifests``: server-side apply in dependency order, prune, wait.

The order: Namespaces, then CustomResourceDefinitions (awaited until
established, so that their kinds are served), then cluster-scoped objects,
then namespaced ones; within each, kinds in the order Helm installs them
(ServiceAccounts, Secrets, ConfigMaps ... before workloads), then as given.
Each object is applied with field manager ``k8s-reverse-tunnel``, taking
over fields another manager holds (this command is the source of truth for
the fields it sets). See :mod:`.applyset` for prune.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from tunnel_commands import ManifestsSpec

from .applyset import ApplySet, ApplySetRecord, Identity, kind_key
from .errors import ExecutorError, KubeRequestError
from .kube import ApiResource, split_api_version
from .readiness import WaitTarget, needs_wait, wait_ready
from .steps import Step, StepReport

__all__ = ["KIND_ORDER", "apply_rank", "run_manifests"]

#: Kinds in the order they are applied within a scope (Helm's install order).
KIND_ORDER = (
    "Namespace",
    "NetworkPolicy",
    "ResourceQuota",
    "LimitRange",
    "PodSecurityPolicy",
    "PodDisruptionBudget",
    "ServiceAccount",
    "Secret",
    "ConfigMap",
    "StorageClass",
    "PersistentVolume",
    "PersistentVolumeClaim",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "Service",
    "DaemonSet",
    "Pod",
    "ReplicationController",
    "ReplicaSet",
    "Deployment",
    "HorizontalPodAutoscaler",
    "StatefulSet",
    "Job",
    "CronJob",
    "IngressClass",
    "Ingress",
    "APIService",
)
_RANK = {kind: rank for rank, kind in enumerate(KIND_ORDER)}
_NAMESPACES = ApiResource("", "v1", "Namespace", "namespaces", namespaced=False)
_CRDS = ApiResource(
    "apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions", False
)
_CRD_WAIT = 60
_LISTED = 200


def apply_rank(resource: ApiResource) -> tuple[int, int]:
    """Sort key of a kind: Namespaces, CRDs, cluster-scoped, namespaced; then KIND_ORDER."""
    if resource.group == "" and resource.kind == "Namespace":
        scope = 0
    elif resource.group == _CRDS.group and resource.kind == _CRDS.kind:
        scope = 1
    else:
        scope = 2 if not resource.namespaced else 3
    return scope, _RANK.get(resource.kind, len(KIND_ORDER))


def _prune_rank(resource: ApiResource) -> int:
    scope, rank = apply_rank(resource)
    return -(scope * 1000 + rank)  # the reverse: workloads first, namespaces last


@dataclass
class _Planned:
    index: int
    path: str
    body: dict[str, Any]
    resource: ApiResource | None = None
    namespace: str | None = None

    @property
    def api_version(self) -> str:
        return str(self.body["apiVersion"])

    @property
    def kind(self) -> str:
        return str(self.body["kind"])

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    def __str__(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {where}"

    def identity(self) -> Identity:
        group = split_api_version(self.api_version)[0]
        return (group, self.kind, self.namespace or "", self.name)


async def run_manifests(spec: ManifestsSpec, step: Step) -> StepReport:
    # The record is the agent's own bookkeeping, in its namespace: written as the
    # agent. What the set holds is applied, listed and pruned as the submitter.
    applyset = ApplySet(step.client, step.context.namespace, spec.apply_set, step.client.as_agent())
    planned = []
    for index, obj in enumerate(spec.objects):
        path = step.path_of("objects", index)
        body = copy.deepcopy(await step.values.resolve(obj, path))
        body["metadata"].setdefault("labels", {}).update(applyset.labels())
        planned.append(_Planned(index, path, body))
    current = ApplySetRecord(
        frozenset(kind_key(p.api_version, p.kind) for p in planned),
        frozenset(
            ns
            for p in planned
            if (ns := p.body["metadata"].get("namespace") or spec.namespace) is not None
        ),
    )
    previous = await applyset.load()
    # Widen the record first: a run that stops half way still knows every kind.
    await applyset.save(previous | current)

    early = [p for p in planned if (p.api_version, p.kind) in _EARLY]
    early.sort(key=lambda p: (_EARLY[(p.api_version, p.kind)], p.index))
    for item in early:
        item.resource = _NAMESPACES if item.kind == "Namespace" else _CRDS
        await _apply(step, item, spec)
    crds = [WaitTarget(_CRDS, None, p.name) for p in early if p.resource is _CRDS]
    if crds:
        await wait_ready(
            step.client,
            crds,
            within=spec.wait_timeout or _CRD_WAIT,
            poll_interval=step.context.poll_interval,
            emit=step.emit,
            what=step.path_of("objects"),
        )
        step.client.forget_discovery()

    rest = [p for p in planned if (p.api_version, p.kind) not in _EARLY]
    for item in rest:
        item.resource = await _resource(step, item)
    rest.sort(key=lambda p: (apply_rank(p.resource) if p.resource else (9, 0), p.index))
    for item in rest:
        await _apply(step, item, spec)

    applied = early + rest
    pruned: list[str] = []
    if spec.prune:
        keep = {p.identity() for p in applied}
        pruned = await applyset.prune(keep, previous | current, _prune_rank, step.emit)
        await applyset.save(current)

    waited = [
        WaitTarget(p.resource, p.namespace, p.name)
        for p in rest
        if p.resource is not None and needs_wait(p.resource)
    ]
    if spec.wait_timeout is not None and waited:
        await wait_ready(
            step.client,
            waited,
            within=spec.wait_timeout,
            poll_interval=step.context.poll_interval,
            emit=step.emit,
            what=step.path_of("wait"),
        )
    summary: dict[str, Any] = {
        "applySet": spec.apply_set,
        "applied": [str(p) for p in applied[:_LISTED]],
        "appliedCount": len(applied),
        "pruned": pruned[:_LISTED],
        "prunedCount": len(pruned),
        "awaited": len(waited) if spec.wait_timeout is not None else 0,
    }
    return StepReport(summary)


_EARLY = {("v1", "Namespace"): 0, ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): 1}


async def _resource(step: Step, item: _Planned) -> ApiResource:
    try:
        resource = await step.client.resource(item.api_version, item.kind)
    except KubeRequestError as exc:
        raise ExecutorError(
            f"{item.path}: cannot discover {item.api_version}: {exc.detail}"
        ) from exc
    if resource is None:
        raise ExecutorError(
            f"{item.path}: the cluster serves no kind {item.kind} in {item.api_version}"
        )
    return resource


async def _apply(step: Step, item: _Planned, spec: ManifestsSpec) -> None:
    assert item.resource is not None
    metadata = item.body["metadata"]
    if item.resource.namespaced:
        item.namespace = metadata.get("namespace") or spec.namespace
        if not item.namespace:
            raise ExecutorError(
                f"{item.path}.metadata.namespace: required for a namespaced {item.kind} "
                "(or set spec.namespace)"
            )
        metadata["namespace"] = item.namespace
    else:
        metadata.pop("namespace", None)
    step.context.check_not_own(item.namespace, item.path)
    try:
        await step.client.apply(item.resource, item.namespace, item.body)
    except KubeRequestError as exc:
        raise ExecutorError(f"{item.path}: {item} was refused: {exc.detail}") from exc
    step.emit(f"applied {item}")
