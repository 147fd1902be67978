"""``kubectl auth can-i`` through the tunnel tells the truth: the agent's policy narrows the answer.

Real kubectl (its typed client sends the review as protobuf), the real server
and agent, and the Kubernetes stand-in, which allows everything here: what
says "no" is the agent's policy alone.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from protocol import kinds
from tests.kubestub import KubeStub
from tests.kubestub_tests.kubectl import Kubectl
from tunnel_agent.kubeapi import KubeApi, load_kube_configuration
from tunnel_agent.kubeproxy import KubeProxy
from tunnel_agent.policy import ProxyPolicy
from tunnel_agent.router import StreamRouter

from .harness import RunningServer, agent_settings, running_agent


@dataclass
class Through:
    kubectl: Kubectl
    stub: KubeStub


async def _through(
    server: RunningServer, tmp_path: Path, policy: ProxyPolicy
) -> AsyncIterator[Through]:
    bootstrap = await server.add_cluster("prod-eu")
    status, answer = await server.api("POST", "/api/v1/users", {"name": "alice", "groups": []})
    assert status == 201, answer
    status, _ = await server.api("PUT", "/api/v1/grants/alice/prod-eu", {})
    assert status == 200
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "prod-eu",
                "cluster": {
                    "server": f"{server.url}/k8s/clusters/prod-eu",
                    "certificate-authority-data": base64.b64encode(server.ca_pem).decode(),
                },
            }
        ],
        "users": [{"name": "alice", "user": {"token": answer["token"]}}],
        "contexts": [{"name": "prod-eu", "context": {"cluster": "prod-eu", "user": "alice"}}],
        "current-context": "prod-eu",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(kubeconfig))
    (tmp_path / "home").mkdir()
    async with KubeStub() as stub:
        api = KubeApi(await load_kube_configuration(stub.write_kubeconfig(tmp_path / "agent.kc")))
        proxy = KubeProxy(api, policy)
        router = StreamRouter()
        router.add(kinds.STREAM_HTTP, proxy.handle)
        settings = agent_settings(server, "prod-eu", bootstrap, tmp_path / "creds")
        try:
            async with running_agent(settings, on_stream=router) as agent:
                await agent.wait_connected()
                yield Through(Kubectl(path, tmp_path / "home", tmp_path), stub)
        finally:
            await proxy.close()
            await api.close()


@pytest.fixture
async def read_only(server: RunningServer, tmp_path: Path) -> AsyncIterator[Through]:
    async for through in _through(server, tmp_path, ProxyPolicy(read_only=True)):
        yield through


@pytest.fixture
async def scoped(server: RunningServer, tmp_path: Path) -> AsyncIterator[Through]:
    async for through in _through(server, tmp_path, ProxyPolicy(namespaces=frozenset({"team"}))):
        yield through


async def test_a_read_only_agent_says_no_to_a_write_and_yes_to_a_read(read_only: Through) -> None:
    create = await read_only.kubectl.run("auth", "can-i", "create", "pods")
    assert create.returncode == 1, create.stderr
    assert create.stdout == "no - the agent: this agent is read-only: create is not allowed\n"
    get = await read_only.kubectl.run("auth", "can-i", "get", "pods")
    assert (get.returncode, get.stdout) == (0, "yes\n"), get.stderr
    exec_ = await read_only.kubectl.run("auth", "can-i", "get", "pods", "--subresource=exec")
    assert exec_.stdout.startswith("no - the agent: this agent is read-only")
    # The API server was asked, as alice, and would have said yes.
    reviews = [r for r in read_only.stub.requests if r.path.endswith("selfsubjectaccessreviews")]
    assert reviews
    assert all(r.header("Impersonate-User") == "tunnel:alice" for r in reviews)


async def test_a_read_only_agents_rules_list_only_reads(read_only: Through) -> None:
    listed = await read_only.kubectl.run("auth", "can-i", "--list")
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()[1:] if line.strip()]
    assert rows
    for row in rows:
        verbs = row[-1].strip("[]").split()
        assert set(verbs) <= {"get", "list", "watch"}, row


async def test_a_namespace_scoped_agent_says_no_outside_its_namespaces(scoped: Through) -> None:
    inside = await scoped.kubectl.run("auth", "can-i", "create", "pods", "-n", "team")
    assert inside.stdout == "yes\n", inside.stderr
    outside = await scoped.kubectl.run("auth", "can-i", "create", "pods", "-n", "other")
    assert outside.stdout == (
        "no - the agent: this agent serves namespaces team only, not other requests\n"
    )
    cluster_wide = await scoped.kubectl.run("auth", "can-i", "list", "nodes")
    assert cluster_wide.stdout.startswith("no - the agent: this agent serves namespaces team")


async def test_secrets_can_be_listed_but_not_written_without_secret_values(
    scoped: Through,
) -> None:
    listed = await scoped.kubectl.run("auth", "can-i", "list", "secrets", "-n", "team")
    assert listed.stdout == "yes\n"
    created = await scoped.kubectl.run("auth", "can-i", "create", "secrets", "-n", "team")
    assert created.stdout == (
        "no - the agent: Secrets can only be listed by name through this tunnel\n"
    )
