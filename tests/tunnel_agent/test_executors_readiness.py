"""Readiness of the kinds the manifests executor waits for (tunnel_agent.executors.readiness)."""

from __future__ import annotations

from typing import Any

import pytest

from tunnel_agent.executors.kube import ApiResource
from tunnel_agent.executors.readiness import Readiness, check_readiness, needs_wait

DEPLOYMENT = ApiResource("apps", "v1", "Deployment", "deployments", True)
STATEFULSET = ApiResource("apps", "v1", "StatefulSet", "statefulsets", True)
DAEMONSET = ApiResource("apps", "v1", "DaemonSet", "daemonsets", True)
JOB = ApiResource("batch", "v1", "Job", "jobs", True)
CRD = ApiResource(
    "apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions", False
)
CONFIGMAP = ApiResource("", "v1", "ConfigMap", "configmaps", True)


def _obj(spec: dict[str, Any], status: dict[str, Any], generation: int = 1) -> dict[str, Any]:
    return {"metadata": {"generation": generation}, "spec": spec, "status": status}


@pytest.mark.parametrize(
    ("resource", "obj", "expected"),
    [
        (
            DEPLOYMENT,
            _obj({"replicas": 3}, {"observedGeneration": 2, "updatedReplicas": 3,
                                   "availableReplicas": 3}, generation=2),
            Readiness(True),
        ),
        (
            DEPLOYMENT,
            _obj({"replicas": 3}, {"observedGeneration": 1, "updatedReplicas": 3,
                                   "availableReplicas": 3}, generation=2),
            Readiness(False, "the new generation is not yet observed"),
        ),
        (
            DEPLOYMENT,
            _obj({"replicas": 3}, {"observedGeneration": 1, "updatedReplicas": 3,
                                   "availableReplicas": 1}),
            Readiness(False, "1 of 3 replicas available"),
        ),
        (
            DEPLOYMENT,
            _obj({}, {"observedGeneration": 1, "updatedReplicas": 0}),
            Readiness(False, "0 of 1 replicas updated"),
        ),
        (
            DEPLOYMENT,
            _obj({"replicas": 1}, {"conditions": [{"type": "Progressing", "status": "False",
                  "reason": "ProgressDeadlineExceeded", "message": "took too long"}]}),
            Readiness(False, "took too long", failed=True),
        ),
        (
            STATEFULSET,
            _obj({"replicas": 2}, {"observedGeneration": 1, "readyReplicas": 1,
                                   "updatedReplicas": 2}),
            Readiness(False, "1 of 2 replicas ready, 2 updated"),
        ),
        (
            STATEFULSET,
            _obj({"replicas": 2}, {"observedGeneration": 1, "readyReplicas": 2,
                                   "updatedReplicas": 2}),
            Readiness(True),
        ),
        (
            DAEMONSET,
            _obj({}, {"observedGeneration": 1, "desiredNumberScheduled": 3,
                      "updatedNumberScheduled": 3, "numberAvailable": 2}),
            Readiness(False, "2 of 3 pods available, 3 updated"),
        ),
        (JOB, _obj({"completions": 2}, {"succeeded": 1}), Readiness(False, "1 of 2 completions")),
        (JOB, _obj({"completions": 2}, {"succeeded": 2}), Readiness(True)),
        (CRD, {"status": {"conditions": [{"type": "Established", "status": "True"}]}},
         Readiness(True)),
        (CRD, {"status": {}}, Readiness(False, "not yet established")),
        (CONFIGMAP, {}, Readiness(True)),
    ],
)  # fmt: skip
def test_readiness_of_each_kind(
    resource: ApiResource, obj: dict[str, Any], expected: Readiness
) -> None:
    assert check_readiness(resource, obj) == expected


def test_only_kinds_with_a_readiness_are_waited_for() -> None:
    assert [needs_wait(r) for r in (DEPLOYMENT, STATEFULSET, DAEMONSET, JOB, CRD, CONFIGMAP)] == [
        True, True, True, True, True, False,
    ]  # fmt: skip
