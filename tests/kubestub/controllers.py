"""The workload controllers a cluster runs, reduced to what kubectl users notice.

Deployments and jobs get pods made from their templates (owned by them, so
``kubectl logs deploy/web`` and ``kubectl get pods`` behave as usual): a
deployment keeps ``spec.replicas`` pods of its current template (a changed
template replaces them, a rollout without the ReplicaSet in between), a job
runs ``spec.parallelism`` pods. Pods of a deleted owner are deleted, as the
garbage collector deletes them. Reconciling runs just after the write that
triggers it, never inside it, so watchers see the owner's event first.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import secrets
from typing import Any

from tests.kubestub.admission import prepare_create
from tests.kubestub.kinds import require_kind
from tests.kubestub.store import Store, WatchEvent

__all__ = ["WorkloadController"]

PODS = require_kind("", "v1", "pods")
DEPLOYMENTS = require_kind("apps", "v1", "deployments")
JOBS = require_kind("batch", "v1", "jobs")
_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_MAX_PODS = 100


def _suffix() -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(5))


class WorkloadController:
    """Keeps the pods of deployments and jobs in line with their specs."""

    def __init__(self, store: Store) -> None:
        self._store = store
        store.listeners.append(self._on_event)

    def _on_event(self, event: WatchEvent) -> None:
        meta = event.obj["metadata"]
        namespace = meta.get("namespace", "")
        if event.kind is PODS and event.type == "DELETED":
            # A deleted pod of a live owner is replaced.
            for ref in meta.get("ownerReferences") or []:
                owner_kind = {"Deployment": DEPLOYMENTS, "Job": JOBS}.get(ref.get("kind", ""))
                if owner_kind is not None and ref.get("controller"):
                    self._schedule((owner_kind, namespace, ref["name"], ref["uid"], "MODIFIED"))
            return
        if event.kind not in (DEPLOYMENTS, JOBS):
            return
        self._schedule((event.kind, namespace, meta["name"], meta["uid"], event.type))

    def _schedule(self, work: tuple[Any, str, str, str, str]) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._reconcile(*work)
            return
        loop.call_soon(self._reconcile, *work)

    def _owned(self, namespace: str, uid: str) -> list[dict[str, Any]]:
        return [
            pod
            for pod in self._store.list(PODS, namespace)
            if any(ref.get("uid") == uid for ref in pod["metadata"].get("ownerReferences") or [])
        ]

    def _reconcile(self, kind: Any, namespace: str, name: str, uid: str, event: str) -> None:
        owned = self._owned(namespace, uid)
        owner = self._store.find(kind, namespace, name)
        if event == "DELETED" or owner is None or owner["metadata"]["uid"] != uid:
            for pod in owned:
                self._delete(namespace, pod["metadata"]["name"])
            return
        spec = owner.get("spec") or {}
        template = spec.get("template") or {}
        template_hash = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[
            :10
        ]
        if kind is DEPLOYMENTS:
            wanted = min(int(spec.get("replicas", 1)), _MAX_PODS)
            current = []
            for pod in owned:
                labels = pod["metadata"].get("labels") or {}
                if labels.get("pod-template-hash") == template_hash:
                    current.append(pod)
                else:
                    self._delete(namespace, pod["metadata"]["name"])
            for pod in current[wanted:]:
                self._delete(namespace, pod["metadata"]["name"])
            for _ in range(wanted - len(current)):
                self._create(owner, f"{name}-{template_hash}-{_suffix()}", template_hash)
        elif not owned:
            for _ in range(min(int(spec.get("parallelism", 1)), _MAX_PODS)):
                self._create(owner, f"{name}-{_suffix()}", "")

    def _create(self, owner: dict[str, Any], pod_name: str, template_hash: str) -> None:
        template = copy.deepcopy((owner.get("spec") or {}).get("template") or {})
        meta = template.get("metadata") or {}
        labels = dict(meta.get("labels") or {})
        if template_hash:
            labels["pod-template-hash"] = template_hash
        namespace = owner["metadata"].get("namespace", "default")
        metadata: dict[str, Any] = {
            "name": pod_name,
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [
                {
                    "apiVersion": owner["apiVersion"],
                    "kind": owner["kind"],
                    "name": owner["metadata"]["name"],
                    "uid": owner["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        }
        if meta.get("annotations"):
            metadata["annotations"] = dict(meta["annotations"])
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": metadata,
            "spec": template.get("spec") or {},
        }
        self._store.create(PODS, prepare_create(PODS, pod, namespace))

    def _delete(self, namespace: str, name: str) -> None:
        if self._store.find(PODS, namespace, name) is not None:
            self._store.delete(PODS, namespace, name)
