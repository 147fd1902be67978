"""Waiting until applied objects are ready: rollouts done, jobs complete, CRDs established.

Kinds without a notion of readiness are ready once applied. A state that can
no longer become ready (a failed Job, a Deployment past its progress
deadline) fails at once instead of waiting for the timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tunnel_commands.durations import format_duration

from .errors import ExecutorError, KubeRequestError
from .kube import ApiResource, KubeClient

__all__ = ["Readiness", "WaitTarget", "check_readiness", "needs_wait", "wait_ready"]


@dataclass(frozen=True, slots=True)
class Readiness:
    """``ready``, or not yet with what is missing, or ``failed`` for good."""

    ready: bool
    message: str = ""
    failed: bool = False


@dataclass(frozen=True, slots=True)
class WaitTarget:
    resource: ApiResource
    namespace: str | None
    name: str

    def __str__(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.resource.kind} {where}"


_READY = Readiness(True)


def _int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for condition in status.get("conditions") or []:
        if isinstance(condition, dict) and condition.get("type") == kind:
            return condition
    return None


def _observed(obj: dict[str, Any]) -> bool:
    generation = _int(obj.get("metadata", {}).get("generation"), 0)
    return _int(obj.get("status", {}).get("observedGeneration"), 0) >= generation


def _deployment(obj: dict[str, Any]) -> Readiness:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    progressing = _condition(status, "Progressing")
    if progressing and progressing.get("reason") == "ProgressDeadlineExceeded":
        return Readiness(
            False, str(progressing.get("message") or "progress deadline exceeded"), True
        )
    if not _observed(obj):
        return Readiness(False, "the new generation is not yet observed")
    wanted = _int(spec.get("replicas"), 1)
    updated = _int(status.get("updatedReplicas"))
    available = _int(status.get("availableReplicas"))
    if updated < wanted:
        return Readiness(False, f"{updated} of {wanted} replicas updated")
    if available < wanted:
        return Readiness(False, f"{available} of {wanted} replicas available")
    return _READY


def _statefulset(obj: dict[str, Any]) -> Readiness:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    if not _observed(obj):
        return Readiness(False, "the new generation is not yet observed")
    wanted = _int(spec.get("replicas"), 1)
    ready = _int(status.get("readyReplicas"))
    updated = _int(status.get("updatedReplicas"))
    if updated < wanted or ready < wanted:
        return Readiness(False, f"{ready} of {wanted} replicas ready, {updated} updated")
    return _READY


def _daemonset(obj: dict[str, Any]) -> Readiness:
    status = obj.get("status") or {}
    if not _observed(obj):
        return Readiness(False, "the new generation is not yet observed")
    wanted = _int(status.get("desiredNumberScheduled"))
    updated = _int(status.get("updatedNumberScheduled"))
    available = _int(status.get("numberAvailable"))
    if updated < wanted or available < wanted:
        return Readiness(False, f"{available} of {wanted} pods available, {updated} updated")
    return _READY


def _job(obj: dict[str, Any]) -> Readiness:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    failed = _condition(status, "Failed")
    if failed and failed.get("status") == "True":
        return Readiness(
            False, str(failed.get("message") or failed.get("reason") or "failed"), True
        )
    complete = _condition(status, "Complete")
    if complete and complete.get("status") == "True":
        return _READY
    wanted = _int(spec.get("completions"), 1)
    succeeded = _int(status.get("succeeded"))
    if succeeded >= wanted:
        return _READY
    return Readiness(False, f"{succeeded} of {wanted} completions")


def _crd(obj: dict[str, Any]) -> Readiness:
    established = _condition(obj.get("status") or {}, "Established")
    if established and established.get("status") == "True":
        return _READY
    return Readiness(False, "not yet established")


_CHECKS: dict[tuple[str, str], Callable[[dict[str, Any]], Readiness]] = {
    ("apps", "Deployment"): _deployment,
    ("apps", "StatefulSet"): _statefulset,
    ("apps", "DaemonSet"): _daemonset,
    ("batch", "Job"): _job,
    ("apiextensions.k8s.io", "CustomResourceDefinition"): _crd,
}


def needs_wait(resource: ApiResource) -> bool:
    """Whether objects of ``resource`` have a readiness to wait for."""
    return (resource.group, resource.kind) in _CHECKS


def check_readiness(resource: ApiResource, obj: dict[str, Any]) -> Readiness:
    check = _CHECKS.get((resource.group, resource.kind))
    return check(obj) if check is not None else _READY


async def wait_ready(
    client: KubeClient,
    targets: Sequence[WaitTarget],
    *,
    within: int,
    poll_interval: float,
    emit: Callable[[str], None],
    what: str,
) -> None:
    """Wait until every target is ready, at most ``within`` seconds for them all.

    ``what`` names the spec field in errors (``spec.wait``).
    """
    current: WaitTarget | None = None
    state = Readiness(False, "not yet read")
    try:
        async with asyncio.timeout(within):
            for current in targets:
                announced = False
                while True:
                    state = await _check(client, current, what)
                    if state.ready:
                        emit(f"ready: {current}")
                        break
                    if state.failed:
                        raise ExecutorError(f"{what}: {current} failed: {state.message}")
                    if not announced:
                        emit(f"waiting for {current}: {state.message}")
                        announced = True
                    await asyncio.sleep(poll_interval)
    except TimeoutError as exc:
        raise ExecutorError(
            f"{what}: timed out after {format_duration(within)} waiting for {current}: "
            f"{state.message}"
        ) from exc


async def _check(client: KubeClient, target: WaitTarget, what: str) -> Readiness:
    try:
        obj = await client.get(target.resource, target.namespace, target.name)
    except KubeRequestError as exc:
        raise ExecutorError(f"{what}: cannot read {target}: {exc.detail}") from exc
    return check_readiness(target.resource, obj)
