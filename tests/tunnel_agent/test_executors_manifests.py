"""The manifests executor against the stand-in API server (tests.kubestub)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakebin.support import Harness, command, harness
from tests.kubestub.kinds import find_kind
from tunnel_agent.executors import execute
from tunnel_agent.executors.kube import ApiResource
from tunnel_agent.executors.labels import APPLY_SET, APPLY_SET_RECORD, MANAGED_BY
from tunnel_agent.executors.manifests import apply_rank

SECRET = "s3cr3t-Pa55w0rd"
JOBS = find_kind("batch", "v1", "jobs")


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    async with harness(tmp_path) as running:
        running.stub.add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "vault"}})
        running.add_secret("vault", "db", {"password": SECRET})
        yield running


def _configmap(name: str, namespace: str | None = None, **data: Any) -> dict[str, Any]:
    metadata = {"name": name} | ({"namespace": namespace} if namespace else {})
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}


def _deployment(name: str, replicas: int = 2) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "app", "image": "nginx:1.27"}]},
            },
        },
    }


def _job(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "migrate", "image": "busybox:1.36"}],
                }
            }
        },
    }


def _applied(h: Harness) -> list[str]:
    """The paths the executor applied (PATCHed), in order, the record ConfigMaps left out."""
    return [
        request.path
        for request in h.stub.requests
        if request.method == "PATCH" and "tunnel-applyset-" not in request.path
    ]


async def test_objects_are_applied_namespaces_first_and_workloads_last(h: Harness) -> None:
    objects = [
        _deployment("web"),
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
         "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}},
        _configmap("settings", mode="prod"),
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "web"}},
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "web"}},
    ]  # fmt: skip
    result = await execute(
        command("manifests", {"objects": objects, "namespace": "web"}), h.context()
    )
    assert result.outcome == "succeeded", result.error
    assert _applied(h) == [
        "/api/v1/namespaces/web",
        "/api/v1/namespaces/web/serviceaccounts/web",
        "/api/v1/namespaces/web/configmaps/settings",
        "/api/v1/namespaces/web/services/web",
        "/apis/apps/v1/namespaces/web/deployments/web",
    ]
    assert result.summary["applied"] == [
        "Namespace web",
        "ServiceAccount web/web",
        "ConfigMap web/settings",
        "Service web/web",
        "Deployment web/web",
    ]
    assert "applied Deployment web/web" in h.lines


def test_the_apply_order_puts_crds_and_cluster_scoped_kinds_before_namespaced_ones() -> None:
    def resource(kind: str, group: str = "", namespaced: bool = True) -> ApiResource:
        return ApiResource(group, "v1", kind, kind.lower() + "s", namespaced)

    kinds = [
        resource("Deployment", "apps"),
        resource("Widget", "example.com"),
        resource("Secret"),
        resource("ClusterRole", "rbac.authorization.k8s.io", namespaced=False),
        resource("CustomResourceDefinition", "apiextensions.k8s.io", namespaced=False),
        resource("Namespace", namespaced=False),
        resource("ServiceAccount"),
        resource("ConfigMap"),
    ]
    assert [r.kind for r in sorted(kinds, key=apply_rank)] == [
        "Namespace",
        "CustomResourceDefinition",
        "ClusterRole",
        "ServiceAccount",
        "Secret",
        "ConfigMap",
        "Deployment",
        "Widget",
    ]


async def test_applied_objects_carry_the_apply_set_labels_and_field_manager(h: Harness) -> None:
    result = await execute(
        command("manifests", {"objects": [_configmap("settings", "default", a="1")]}),
        h.context(),
    )
    assert result.outcome == "succeeded", result.error
    obj = h.stub.get("v1", "ConfigMap", "settings", "default")
    assert obj is not None
    assert obj["metadata"]["labels"] == {MANAGED_BY: "k8s-reverse-tunnel", APPLY_SET: "web-app"}
    assert [entry["manager"] for entry in obj["metadata"]["managedFields"]] == [
        "k8s-reverse-tunnel"
    ]
    assert obj["data"] == {"a": "1"}


async def test_secret_refs_in_objects_are_resolved_in_the_cluster_only(h: Harness) -> None:
    ref = {"secretRef": {"namespace": "vault", "name": "db", "key": "password"}}
    config = _configmap("settings", "default") | {"data": {"url": "postgres://db", "pw": ref}}
    result = await execute(command("manifests", {"objects": [config]}), h.context())
    assert result.outcome == "succeeded", result.error
    obj = h.stub.get("v1", "ConfigMap", "settings", "default")
    assert obj is not None
    assert obj["data"] == {"url": "postgres://db", "pw": SECRET}
    assert SECRET not in json.dumps(result.to_dict())
    assert SECRET not in h.log_text()


async def test_a_namespaced_object_without_a_namespace_fails_naming_it(h: Harness) -> None:
    result = await execute(command("manifests", {"objects": [_configmap("settings")]}), h.context())
    assert result.outcome == "failed"
    assert result.error == (
        "spec.objects[0].metadata.namespace: required for a namespaced ConfigMap "
        "(or set spec.namespace)"
    )


async def test_an_unserved_kind_fails_naming_the_object(h: Harness) -> None:
    widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    result = await execute(command("manifests", {"objects": [widget]}), h.context())
    assert result.error == "spec.objects[0]: the cluster serves no kind Widget in example.com/v1"


async def test_an_object_the_api_refuses_fails_with_the_api_message(h: Harness) -> None:
    bad = _deployment("web")
    bad["spec"]["template"]["spec"]["containers"] = []
    result = await execute(
        command("manifests", {"objects": [_configmap("ok"), bad], "namespace": "default"}),
        h.context(),
    )
    assert result.outcome == "failed"
    assert result.error is not None
    assert result.error.startswith(
        "spec.objects[1]: Deployment default/web was refused: HTTP 422: "
    )
    assert "spec.template.spec.containers: Required value" in result.error


async def test_a_secret_the_api_quotes_in_a_refusal_is_masked_wherever_it_falls(
    h: Harness,
) -> None:
    # The API server quotes invalid values; padding moves the Secret's value
    # along the message, across any place it might be cut (it was cut at 500
    # characters before masking, and half a secret is not masked).
    ref = {"secretRef": {"namespace": "vault", "name": "db", "key": "password"}}
    for pad in range(360, 560, 7):
        bad = _deployment("web")
        bad["spec"]["template"]["metadata"]["labels"] = {"app": "other", "pad": "x" * pad, "z": ref}
        spec = {"objects": [bad], "namespace": "default"}
        result = await execute(command("manifests", spec), h.context())
        assert result.error is not None
        assert SECRET[:6] not in result.error, pad
        assert "does not match template" in result.error
    assert SECRET[:6] not in h.log_text()


async def test_prune_deletes_what_the_set_no_longer_holds_and_nothing_else(h: Harness) -> None:
    first = {
        "objects": [_configmap("keep"), _configmap("drop"), _deployment("old-web")],
        "namespace": "default",
        "prune": True,
    }
    assert (await execute(command("manifests", first), h.context())).succeeded
    h.stub.add(_configmap("unmanaged", "default"))
    other_set = {"objects": [_configmap("other")], "namespace": "default"}
    assert (await execute(command("manifests", other_set, name="other-app"), h.context())).succeeded

    second = first | {"objects": [_configmap("keep", x="2")]}
    result = await execute(command("manifests", second), h.context())
    assert result.outcome == "succeeded", result.error
    assert sorted(result.summary["pruned"]) == [
        "ConfigMap default/drop",
        "Deployment default/old-web",
    ]
    assert h.stub.get("v1", "ConfigMap", "drop", "default") is None
    assert h.stub.get("apps/v1", "Deployment", "old-web", "default") is None
    for kept in ("keep", "unmanaged", "other"):
        assert h.stub.get("v1", "ConfigMap", kept, "default") is not None, kept


async def test_without_prune_nothing_is_deleted_but_the_record_remembers(h: Harness) -> None:
    first = {"objects": [_configmap("a"), _configmap("b")], "namespace": "default"}
    assert (await execute(command("manifests", first), h.context())).succeeded
    second = first | {"objects": [_configmap("a")]}
    assert (await execute(command("manifests", second), h.context())).succeeded
    assert h.stub.get("v1", "ConfigMap", "b", "default") is not None
    # A later prune still finds b: the record kept its kind and namespace.
    third = second | {"prune": True}
    result = await execute(command("manifests", third), h.context())
    assert result.summary["pruned"] == ["ConfigMap default/b"]


async def test_the_record_lives_in_the_agents_namespace(h: Harness) -> None:
    h.stub.add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "tunnel-system"}})
    spec = {"objects": [_configmap("a"), _deployment("web")], "namespace": "web-ns"}
    h.stub.add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "web-ns"}})
    result = await execute(command("manifests", spec), h.context(namespace="tunnel-system"))
    assert result.outcome == "succeeded", result.error
    record = h.stub.get("v1", "ConfigMap", "tunnel-applyset-web-app", "tunnel-system")
    assert record is not None
    assert record["metadata"]["labels"] == {
        MANAGED_BY: "k8s-reverse-tunnel",
        APPLY_SET_RECORD: "web-app",
    }
    assert json.loads(record["data"]["kinds"]) == ["apps/v1/Deployment", "v1/ConfigMap"]
    assert json.loads(record["data"]["namespaces"]) == ["web-ns"]


async def test_a_ready_deployment_is_awaited_without_delay(h: Harness) -> None:
    result = await execute(
        command("manifests", {"objects": [_deployment("web")], "namespace": "default"}),
        h.context(),
    )
    assert result.outcome == "succeeded", result.error
    assert result.summary["awaited"] == 1
    assert "ready: Deployment default/web" in h.lines


async def test_a_job_is_awaited_until_it_completes(h: Harness) -> None:
    spec = {"objects": [_job("migrate")], "namespace": "default", "wait": {"timeout": "1m"}}
    run = asyncio.create_task(execute(command("manifests", spec), h.context(poll_interval=0.05)))
    await h.line_seen("waiting for Job default/migrate: 0 of 1 completions").wait()
    job = h.stub.get("batch/v1", "Job", "migrate", "default")
    assert job is not None
    job["status"] = {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}
    assert JOBS is not None
    h.stub.store.update(JOBS, job)
    result = await run
    assert result.outcome == "succeeded", result.error
    assert "ready: Job default/migrate" in h.lines


async def test_a_failed_job_fails_the_wait_at_once(h: Harness) -> None:
    spec = {"objects": [_job("migrate")], "namespace": "default", "wait": {"timeout": "1h"}}
    run = asyncio.create_task(execute(command("manifests", spec), h.context(poll_interval=0.05)))
    await h.line_seen("waiting for Job default/migrate").wait()
    job = h.stub.get("batch/v1", "Job", "migrate", "default")
    assert job is not None
    job["status"] = {
        "failed": 1,
        "conditions": [{"type": "Failed", "status": "True", "message": "BackoffLimitExceeded"}],
    }
    assert JOBS is not None
    h.stub.store.update(JOBS, job)
    result = await run
    assert result.error == "spec.wait: Job default/migrate failed: BackoffLimitExceeded"


async def test_a_job_that_never_completes_times_out_the_wait(h: Harness) -> None:
    spec = {"objects": [_job("migrate")], "namespace": "default", "wait": {"timeout": "1s"}}
    result = await execute(command("manifests", spec), h.context(poll_interval=0.05))
    assert result.error == (
        "spec.wait: timed out after 1s waiting for Job default/migrate: 0 of 1 completions"
    )


async def test_wait_false_does_not_wait(h: Harness) -> None:
    spec = {"objects": [_job("migrate")], "namespace": "default", "wait": False}
    result = await execute(command("manifests", spec), h.context())
    assert result.outcome == "succeeded", result.error
    assert result.summary["awaited"] == 0
