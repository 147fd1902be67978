"""kubernetes_asyncio (what the agent uses) against the stand-in: Secrets and Deployments."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client, config

from tests.kubestub import KubeStub


@pytest.fixture
async def api(stub: KubeStub, tmp_path: Path) -> AsyncIterator[client.ApiClient]:
    configuration = client.Configuration()
    path = stub.write_kubeconfig(tmp_path / "kubeconfig")
    await config.load_kube_config(config_file=str(path), client_configuration=configuration)
    async with client.ApiClient(configuration) as api_client:
        yield api_client


def _status(error: client.ApiException) -> dict[str, Any]:
    """The Status body of a failed call."""
    status: dict[str, Any] = json.loads(error.body or b"{}")
    return status


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


async def test_secret_create_read_replace_patch(api: client.ApiClient, stub: KubeStub) -> None:
    core = client.CoreV1Api(api)
    created = await core.create_namespaced_secret(
        "default",
        client.V1Secret(metadata=client.V1ObjectMeta(name="agent"), string_data={"token": "t1"}),
    )
    assert created.data == {"token": _b64("t1")}
    read = await core.read_namespaced_secret("agent", "default")
    assert read.metadata.resource_version == created.metadata.resource_version
    read.data["cert"] = _b64("pem")
    replaced = await core.replace_namespaced_secret("agent", "default", read)
    assert replaced.data == {"token": _b64("t1"), "cert": _b64("pem")}
    assert int(replaced.metadata.resource_version) > int(read.metadata.resource_version)
    patched = await core.patch_namespaced_secret(
        "agent", "default", {"metadata": {"labels": {"rotated": "yes"}}}
    )
    assert patched.metadata.labels == {"rotated": "yes"}
    stored = stub.get("v1", "Secret", "agent", "default")
    assert stored is not None
    assert stored["data"]["cert"] == _b64("pem")


async def test_replace_with_a_stale_resource_version_is_a_conflict(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    secret = client.V1Secret(metadata=client.V1ObjectMeta(name="s"), data={"k": _b64("v")})
    first = await core.create_namespaced_secret("default", secret)
    await core.patch_namespaced_secret("s", "default", {"data": {"k": _b64("w")}})
    first.data = {"k": _b64("x")}
    with pytest.raises(client.ApiException) as caught:
        await core.replace_namespaced_secret("s", "default", first)
    assert caught.value.status == 409
    status = _status(caught.value)
    assert status["reason"] == "Conflict"
    assert "the object has been modified" in status["message"]


async def test_missing_secret_is_a_404_status(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    with pytest.raises(client.ApiException) as caught:
        await core.read_namespaced_secret("nope", "default")
    assert caught.value.status == 404
    assert _status(caught.value)["message"] == 'secrets "nope" not found'


async def test_deployments_create_list_and_scale(api: client.ApiClient) -> None:
    apps = client.AppsV1Api(api)
    labels = {"app": "d1"}
    body = client.V1Deployment(
        metadata=client.V1ObjectMeta(name="d1", labels=labels),
        spec=client.V1DeploymentSpec(
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="nginx")]),
            ),
        ),
    )
    created = await apps.create_namespaced_deployment("default", body)
    assert created.spec.replicas == 1
    assert created.status.ready_replicas == 1
    listed = await apps.list_namespaced_deployment("default", label_selector="app=d1")
    assert [item.metadata.name for item in listed.items] == ["d1"]
    scaled = await apps.patch_namespaced_deployment_scale(
        "d1", "default", {"spec": {"replicas": 3}}
    )
    assert scaled.spec.replicas == 3
    read = await apps.read_namespaced_deployment("d1", "default")
    assert read.spec.replicas == 3
    assert read.metadata.generation == 2


async def test_replacing_a_secret_with_itself_changes_nothing(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    secret = client.V1Secret(metadata=client.V1ObjectMeta(name="same"), data={"k": _b64("v")})
    created = await core.create_namespaced_secret("default", secret)
    replaced = await core.replace_namespaced_secret("same", "default", created)
    assert replaced.metadata.resource_version == created.metadata.resource_version
    assert replaced.metadata.managed_fields == created.metadata.managed_fields
