"""What a run's Job is: its settings and its manifest (:mod:`.jobs` starts and follows it).

The pod mounts no ServiceAccount token, runs as a non-root user with every
capability dropped and a read-only root file system, has resource limits and
a deadline, and runs the agent's own image (``tunnel-agent step``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .labels import MANAGED_BY, MANAGED_BY_VALUE

__all__ = [
    "DOCUMENT",
    "JOB_LABEL",
    "MOUNT",
    "RESULT_MARK",
    "JobSettings",
    "StepRun",
    "job_manifest",
    "parse_result",
    "step_document",
]

#: The label every run's Job, pod and Secret carries (its value: the Job's name).
JOB_LABEL = "tunnel.k8s.io/run"
#: The step's document, in the Secret the pod mounts at MOUNT.
DOCUMENT = "step.json"
MOUNT = "/run/tunnel-step"


@dataclass(frozen=True, slots=True)
class JobSettings:
    """How runs' Jobs are made: the image (the agent's own), limits, the environment passed."""

    image: str
    namespace: str
    cpu_limit: str = "1"
    memory_limit: str = "1Gi"
    storage_limit: str = "2Gi"
    #: Variables of the agent's environment the pod gets (proxies, CA files).
    environment: tuple[tuple[str, str], ...] = ()


def job_manifest(
    name: str, settings: JobSettings, deadline: int, command_id: str
) -> dict[str, Any]:
    """The Job of one step: no token, restricted, limited, bounded in time."""
    labels = {MANAGED_BY: MANAGED_BY_VALUE, JOB_LABEL: name}
    limits = {
        "cpu": settings.cpu_limit,
        "memory": settings.memory_limit,
        "ephemeral-storage": settings.storage_limit,
    }
    environment = [{"name": key, "value": value} for key, value in settings.environment]
    environment += [
        {"name": "HOME", "value": "/work/home"},
        {"name": "TUNNEL_STEP_WORKDIR", "value": "/work"},
    ]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": settings.namespace,
            "labels": labels,
            "annotations": {"tunnel.k8s.io/command": command_id},
        },
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": max(deadline, 1),
            "ttlSecondsAfterFinished": 300,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 65532,
                        "runAsGroup": 65532,
                        "fsGroup": 65532,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [
                        {
                            "name": "step",
                            "image": settings.image,
                            # The image's entry point: tini, then tunnel-agent.
                            "args": ["step", f"{MOUNT}/{DOCUMENT}"],
                            "env": environment,
                            "resources": {
                                "requests": {"cpu": "100m", "memory": "256Mi"},
                                "limits": limits,
                            },
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]},
                            },
                            "volumeMounts": [
                                {"name": "step", "mountPath": MOUNT, "readOnly": True},
                                {"name": "work", "mountPath": "/work"},
                                # The pod's own emptyDir, not a shared /tmp.
                                {"name": "tmp", "mountPath": "/tmp"},  # noqa: S108
                            ],
                        }
                    ],
                    "volumes": [
                        {"name": "step", "secret": {"secretName": name, "defaultMode": 0o400}},
                        {"name": "work", "emptyDir": {"sizeLimit": settings.storage_limit}},
                        {"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}},
                    ],
                },
            },
        },
    }


#: The first characters of the result line (a record separator, then a name).
RESULT_MARK = "\x1etunnel-step-result "


@dataclass(frozen=True, slots=True)
class StepRun:
    """What a step's run needs that its command does not say."""

    command: dict[str, Any]
    kubeconfig: str
    namespace: str
    own_namespace: str | None
    allow_file_git_sources: bool
    masked: list[str]
    path: str


def step_document(run: StepRun) -> bytes:
    """The document the Job's pod reads (it holds secret values: a Secret carries it)."""
    return json.dumps(
        {
            "command": run.command,
            "kubeconfig": run.kubeconfig,
            "namespace": run.namespace,
            "ownNamespace": run.own_namespace,
            "allowFileGitSources": run.allow_file_git_sources,
            "masked": run.masked,
            "path": run.path,
        }
    ).encode()


def parse_result(line: str) -> dict[str, Any] | None:
    """The result a result line carries, or None if ``line`` is not one."""
    if not line.startswith(RESULT_MARK):
        return None
    try:
        result = json.loads(line[len(RESULT_MARK) :])
    except ValueError:
        return None
    return result if isinstance(result, dict) else None
