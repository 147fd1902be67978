"""Apply sets: what a manifests command applied under its name, so that prune can find it.

Every applied object carries two labels, ``app.kubernetes.io/managed-by:
k8s-reverse-tunnel`` and ``tunnel.k8s.io/apply-set: <name>``. Listing by label
needs to know which kinds and namespaces to list, so a record ConfigMap
``tunnel-applyset-<name>`` in the agent's namespace keeps them. The record
is widened (old and new kinds) before anything is applied, and narrowed to
the new set only after a prune succeeded, so a run that stops half way
never loses track of an object.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .errors import ExecutorError, KubeRequestError
from .kube import ApiResource, KubeClient, split_api_version
from .labels import APPLY_SET, APPLY_SET_RECORD, MANAGED_BY, MANAGED_BY_VALUE

__all__ = ["CONFIGMAPS", "RECORD_PREFIX", "ApplySet", "ApplySetRecord", "Identity"]

RECORD_PREFIX = "tunnel-applyset-"
CONFIGMAPS = ApiResource("", "v1", "ConfigMap", "configmaps", namespaced=True)

#: (group, kind, namespace or "", name): an object whatever its version.
Identity = tuple[str, str, str, str]


@dataclass(frozen=True, slots=True)
class ApplySetRecord:
    """The kinds (``apiVersion/Kind``) and namespaces an apply set may have objects in."""

    kinds: frozenset[str] = frozenset()
    namespaces: frozenset[str] = frozenset()

    def __or__(self, other: ApplySetRecord) -> ApplySetRecord:
        return ApplySetRecord(self.kinds | other.kinds, self.namespaces | other.namespaces)


class ApplySet:
    """The apply set ``name``, recorded in ``record_namespace``."""

    def __init__(
        self,
        client: KubeClient,
        record_namespace: str,
        name: str,
        records: KubeClient | None = None,
    ) -> None:
        self.client = client
        #: How the record is read and written (the agent's own identity).
        self.records = records or client
        self.record_namespace = record_namespace
        self.name = name
        self.record_name = RECORD_PREFIX + name

    @property
    def selector(self) -> str:
        return f"{MANAGED_BY}={MANAGED_BY_VALUE},{APPLY_SET}={self.name}"

    def labels(self) -> dict[str, str]:
        return {MANAGED_BY: MANAGED_BY_VALUE, APPLY_SET: self.name}

    async def load(self) -> ApplySetRecord:
        """The record, or an empty one for a new apply set."""
        try:
            record = await self.records.get(CONFIGMAPS, self.record_namespace, self.record_name)
        except KubeRequestError as exc:
            if exc.status == 404:
                return ApplySetRecord()
            raise ExecutorError(f"cannot read the apply set record: {exc.detail}") from exc
        data = record.get("data") or {}
        try:
            kinds = json.loads(data.get("kinds", "[]"))
            namespaces = json.loads(data.get("namespaces", "[]"))
        except ValueError as exc:
            raise ExecutorError(
                f"the apply set record {self.record_namespace}/{self.record_name} is damaged"
            ) from exc
        return ApplySetRecord(
            frozenset(str(kind) for kind in kinds), frozenset(str(ns) for ns in namespaces)
        )

    async def save(self, record: ApplySetRecord) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": self.record_name,
                "namespace": self.record_namespace,
                "labels": {MANAGED_BY: MANAGED_BY_VALUE, APPLY_SET_RECORD: self.name},
            },
            "data": {
                "kinds": json.dumps(sorted(record.kinds)),
                "namespaces": json.dumps(sorted(record.namespaces)),
            },
        }
        try:
            await self.records.apply(CONFIGMAPS, self.record_namespace, body)
        except KubeRequestError as exc:
            raise ExecutorError(
                f"cannot record the apply set in {self.record_namespace}/{self.record_name}: "
                f"{exc.detail}"
            ) from exc

    async def prune(
        self,
        keep: set[Identity],
        record: ApplySetRecord,
        order: Callable[[ApiResource], int],
        emit: Callable[[str], None],
    ) -> list[str]:
        """Delete the set's objects of ``record``'s kinds and namespaces not in ``keep``.

        Deletes in the order ``order`` gives (workloads before namespaces);
        returns ``Kind namespace/name`` of each.
        """
        doomed: list[tuple[ApiResource, str, str]] = []
        for kind_key in sorted(record.kinds):
            api_version, _, kind = kind_key.rpartition("/")
            resource = await self.client.resource(api_version, kind)
            if resource is None:
                continue  # no longer served: nothing of it can be left
            for namespace in _scopes(resource, record.namespaces):
                for item in await self._list(resource, namespace):
                    metadata = item.get("metadata") or {}
                    name = str(metadata.get("name", ""))
                    item_namespace = str(metadata.get("namespace") or "")
                    identity = (resource.group, resource.kind, item_namespace, name)
                    if identity not in keep and not metadata.get("deletionTimestamp"):
                        doomed.append((resource, item_namespace, name))
        doomed.sort(key=lambda entry: order(entry[0]))
        pruned = []
        for resource, namespace, name in doomed:
            where = f"{resource.kind} {namespace + '/' if namespace else ''}{name}"
            try:
                await self.client.delete(resource, namespace or None, name)
            except KubeRequestError as exc:
                raise ExecutorError(f"cannot prune {where}: {exc.detail}") from exc
            emit(f"pruned {where}")
            pruned.append(where)
        return pruned

    async def _list(self, resource: ApiResource, namespace: str | None) -> list[dict[str, Any]]:
        try:
            return await self.client.list(resource, namespace, label_selector=self.selector)
        except KubeRequestError as exc:
            if exc.status == 404:
                return []
            raise ExecutorError(
                f"cannot list {resource.plural} to prune the apply set: {exc.detail}"
            ) from exc


def _scopes(resource: ApiResource, namespaces: Iterable[str]) -> list[str | None]:
    if not resource.namespaced:
        return [None]
    return [*sorted(namespaces)]


def kind_key(api_version: str, kind: str) -> str:
    """How the record names a kind: ``apps/v1/Deployment``."""
    return f"{api_version}/{kind}"


def group_of(api_version: str) -> str:
    return split_api_version(api_version)[0]
