"""The agent tells the server its cluster's Kubernetes version, as the API server says it."""

from __future__ import annotations

from pathlib import Path

from tests.kubestub import KubeStub
from tunnel_agent.kubeapi import KubeApi, load_kube_configuration


async def test_the_version_is_the_api_servers_git_version(tmp_path: Path) -> None:
    async with KubeStub() as stub:
        api = KubeApi(await load_kube_configuration(stub.write_kubeconfig(tmp_path / "kc")))
        try:
            version = await api.kubernetes_version()
        finally:
            await api.close()
    assert version is not None
    assert version.startswith("v1.")


async def test_an_api_server_that_does_not_answer_gives_no_version(tmp_path: Path) -> None:
    async with KubeStub() as stub:
        config = stub.write_kubeconfig(tmp_path / "kc")
    # The stand-in has stopped: nothing listens at its address any more.
    api = KubeApi(await load_kube_configuration(config))
    try:
        assert await api.kubernetes_version() is None
    finally:
        await api.close()
