"""Every command type, end to end: tunnelctl's API -> server -> socket -> agent -> cluster.

The agent runs the real executors against the Kubernetes API stand-in;
helm and tofu are recording fakes on PATH (tests/fakebin). The server must
never receive a Secret value: its database and logs are searched for it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from protocol import kinds
from tests.fakebin import fake_environment, records
from tests.kubestub import KubeStub
from tunnel_agent.commands import build_command_runner
from tunnel_agent.credentials import DirectoryCredentialStore
from tunnel_agent.executors.gateway import CommandsGateway
from tunnel_agent.journal import Journal
from tunnel_agent.kubeapi import KubeApi, load_kube_configuration
from tunnel_agent.router import StreamRouter
from tunnel_agent.runner import CommandRunner

from .harness import RunningServer, agent_settings, running_agent
from .test_commands_delivery import until_state

SECRET = "s3cr3t-Pa55w0rd-e2e"
BOOTSTRAP_TOKEN = "tbt_the-agents-own-bootstrap-token"
PASSWORD_REF = {"secretRef": {"namespace": "vault", "name": "db", "key": "password"}}


@dataclass
class Cluster:
    server: RunningServer
    stub: KubeStub
    record: Path
    runner: CommandRunner

    async def run(self, kind: str, name: str, spec: dict[str, Any], **extra: Any) -> dict[str, Any]:
        document = {"apiVersion": "tunnel/v1", "type": kind, "name": name, "spec": spec, **extra}
        status, created = await self.server.api(
            "POST", "/api/v1/clusters/prod-eu/commands", {"spec": document}
        )
        assert status == 201, created
        return await until_state(
            self.server, created["id"], "succeeded", "failed", "timed_out", "lost"
        )


@pytest.fixture
async def cluster(server: RunningServer, tmp_path: Path) -> AsyncIterator[Cluster]:
    async with KubeStub() as stub:
        stub.add_pod("web")
        for namespace in ("vault", "apps"):
            stub.add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        stub.add(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "db", "namespace": "vault"},
                "stringData": {"password": SECRET},
            }
        )
        bootstrap = await server.add_cluster("prod-eu")
        kubeconfig = stub.write_kubeconfig(tmp_path / "agent.kc")
        kube = KubeApi(await load_kube_configuration(kubeconfig))
        record = tmp_path / "record.jsonl"
        settings = agent_settings(server, "prod-eu", bootstrap, tmp_path / "creds")
        gateway = CommandsGateway(kube)
        runner = build_command_runner(
            kube,
            Journal(DirectoryCredentialStore(tmp_path / "creds")),
            gateway=gateway,
            namespace="default",
            kubeconfig=kubeconfig,
            environment=fake_environment(record),
            masked_values=(BOOTSTRAP_TOKEN,),
            own_namespace="agents",
            # The tests' repositories are local: file:// sources, allowed explicitly.
            allow_file_git_sources=True,
        )
        router = StreamRouter()
        router.add(kinds.STREAM_COMMAND, runner.handle_offer)
        runner_task = asyncio.create_task(runner.run())
        try:
            async with running_agent(
                settings,
                on_stream=router,
                on_message=runner.on_message,
                on_connected=runner.connected,
                on_disconnected=runner.disconnected,
            ) as agent:
                await agent.wait_connected()
                yield Cluster(server, stub, record, runner)
        finally:
            runner_task.cancel()
            await asyncio.gather(runner_task, return_exceptions=True)
            await gateway.close()
            await kube.close()


def configmap(name: str, **data: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "apps"},
        "data": data,
    }


async def test_manifests_apply_creates_then_patches_then_prunes(cluster: Cluster) -> None:
    first = await cluster.run(
        "manifests", "app", {"objects": [configmap("a", colour="blue"), configmap("b", x="1")]}
    )
    assert first["state"] == "succeeded", first["error"]
    assert cluster.stub.get("v1", "ConfigMap", "a", "apps")["data"] == {"colour": "blue"}  # type: ignore[index]
    second = await cluster.run(
        "manifests", "app", {"objects": [configmap("a", colour="green")], "prune": True}
    )
    assert second["state"] == "succeeded", second["error"]
    assert cluster.stub.get("v1", "ConfigMap", "a", "apps")["data"] == {"colour": "green"}  # type: ignore[index]
    assert cluster.stub.get("v1", "ConfigMap", "b", "apps") is None  # pruned


async def test_query_returns_objects_and_logs(cluster: Cluster) -> None:
    cluster.stub.append_log("default", "web", "hello\nworld")
    pods = await cluster.run(
        "query", "pods", {"get": {"apiVersion": "v1", "kind": "Pod", "namespace": "default"}}
    )
    assert pods["state"] == "succeeded", pods["error"]
    items = pods["result"]["summary"]["result"]["items"]
    assert [item["metadata"]["name"] for item in items] == ["web"]
    logs = await cluster.run("query", "logs", {"logs": {"namespace": "default", "pod": "web"}})
    assert logs["state"] == "succeeded", logs["error"]
    assert "hello" in str(logs["result"]["summary"])


async def test_helm_runs_with_resolved_values_that_the_server_never_sees(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    spec = {
        "namespace": "apps",
        "chart": {"repo": "https://charts.example.com", "name": "web", "version": "1.2.3"},
        "values": {"replicas": 2, "db": {"password": PASSWORD_REF}},
    }
    done = await cluster.run("helm", "web", spec)
    assert done["state"] == "succeeded", done["error"]
    [call] = records(cluster.record)
    assert call["argv"][:4] == ["upgrade", "--install", "web", "web"]
    assert SECRET in call["values"]  # resolved inside the cluster...
    assert not any(SECRET in argument for argument in call["argv"])
    await assert_server_never_saw(cluster, caplog)  # ...and never outside it


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    """A git repository with an OpenTofu configuration in ``infra/``."""
    path = tmp_path / "repository"
    (path / "infra").mkdir(parents=True)
    (path / "infra" / "main.tf").write_text('resource "terraform_data" "x" {}\n')
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-C", str(path)]
    subprocess.run(["git", "init", "--quiet", "-b", "main", str(path)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "--quiet", "-m", "infra"], check=True)
    return path


async def test_tofu_variables_from_secrets_and_outputs_by_name_only(
    cluster: Cluster, repository: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    spec = {
        "git": {"url": f"file://{repository}", "ref": "main", "path": "infra"},
        "variables": {"region": "eu-1", "password": PASSWORD_REF},
    }
    done = await cluster.run(
        "tofu", "infra", spec, outputsSecret={"namespace": "apps", "name": "infra-outputs"}
    )
    assert done["state"] == "succeeded", done["error"]
    calls = records(cluster.record)
    apply = next(call for call in calls if call["argv"][0] == "apply")
    assert apply["env"]["TF_VAR_password"] == SECRET
    assert apply["env"]["TF_VAR_region"] == "eu-1"
    outputs = done["result"]["outputs"]
    assert outputs  # names only
    stored = cluster.stub.get("v1", "Secret", "infra-outputs", "apps")
    assert stored is not None
    assert sorted(stored["data"]) == sorted(outputs)
    await assert_server_never_saw(cluster, caplog)


async def test_flow_runs_steps_in_order_and_stops_at_the_first_failure(cluster: Cluster) -> None:
    steps = [
        {"name": "config", "type": "manifests", "objects": [configmap("flowed")]},
        {
            "name": "check",
            "type": "query",
            "get": {"apiVersion": "v1", "kind": "ConfigMap", "namespace": "apps", "name": "flowed"},
        },
    ]
    done = await cluster.run("flow", "release", {"steps": steps})
    assert done["state"] == "succeeded", done["error"]
    assert cluster.stub.get("v1", "ConfigMap", "flowed", "apps") is not None
    failing = [
        {
            "name": "missing",
            "type": "query",
            "get": {"apiVersion": "v1", "kind": "ConfigMap", "namespace": "apps", "name": "nope"},
        },
        {"name": "never", "type": "manifests", "objects": [configmap("never")]},
    ]
    failed = await cluster.run("flow", "broken", {"steps": failing})
    assert failed["state"] == "failed"
    assert "missing" in (failed["error"] or "")
    assert cluster.stub.get("v1", "ConfigMap", "never", "apps") is None


async def test_a_chart_that_cannot_be_fetched_fails_the_command_not_the_agent(
    cluster: Cluster,
) -> None:
    missing = cluster.record.parent / "no-such-repository"
    spec = {
        "namespace": "apps",
        "chart": {"git": {"url": f"file://{missing}", "ref": "main", "path": "chart"}},
    }
    broken = await cluster.run("helm", "broken", spec, timeout="30s")
    assert broken["state"] == "failed"
    assert "git" in (broken["error"] or "").lower()
    assert records(cluster.record) == []  # helm never ran
    # The agent still serves.
    ok = await cluster.run(
        "query", "still-here", {"get": {"apiVersion": "v1", "kind": "Pod", "namespace": "default"}}
    )
    assert ok["state"] == "succeeded"


async def assert_server_never_saw(cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    await cluster.server.context.audit.flush()
    state = cluster.server.settings.state_dir
    for path in state.glob("state.db*"):
        assert SECRET.encode() not in path.read_bytes(), f"{path.name} holds the secret"
    _, commands = await cluster.server.api("GET", "/api/v1/commands?limit=100")
    assert SECRET not in str(commands)
    server_lines = [r.getMessage() for r in caplog.records if r.name.startswith("tunnel_server")]
    assert all(SECRET not in line for line in server_lines)


async def test_the_agents_own_tokens_never_reach_the_server_in_a_result(cluster: Cluster) -> None:
    # As a command that copied them into an object would read them back.
    cluster.stub.add(configmap("copied", sa=cluster.stub.token, bootstrap=BOOTSTRAP_TOKEN))
    get = {"apiVersion": "v1", "kind": "ConfigMap", "namespace": "apps", "name": "copied"}
    done = await cluster.run("query", "read-back", {"get": get})
    assert done["state"] == "succeeded", done["error"]
    text = json.dumps(done)
    assert '"copied"' in text  # the object came back, its values masked
    assert cluster.stub.token not in text
    assert BOOTSTRAP_TOKEN not in text


async def test_each_run_has_a_home_of_its_own(cluster: Cluster, repository: Path) -> None:
    spec = {"git": {"url": f"file://{repository}", "ref": "main", "path": "infra"}}
    for name in ("first", "second"):
        done = await cluster.run("tofu", name, spec)
        assert done["state"] == "succeeded", done["error"]
    inits = [call for call in records(cluster.record) if call["argv"][0] == "init"]
    homes = [Path(call["env"]["HOME"]) for call in inits]
    assert len(set(homes)) == 2
    # Inside the run's own work directory, which goes with the run.
    assert all(
        Path(call["cwd"]).is_relative_to(home.parent)
        for call, home in zip(inits, homes, strict=True)
    )


OWN = {"namespace": "agents", "name": "tunnel-agent-credentials"}
REFUSED = "namespace agents is the agent's own (its credentials, command journal and bootstrap"


async def test_a_command_cannot_read_the_agents_own_secrets(cluster: Cluster) -> None:
    # Its key would let whoever reads it connect as this cluster's agent.
    stolen = {"secretRef": {**OWN, "key": "tls.key"}}
    done = await cluster.run("manifests", "steal", {"objects": [configmap("k", key=stolen)]})
    assert done["state"] == "failed"
    assert REFUSED in done["error"]
    assert cluster.stub.get("v1", "ConfigMap", "k", "apps") is None


async def test_a_command_cannot_write_in_the_agents_own_namespace(cluster: Cluster) -> None:
    overwrite = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": OWN["name"], "namespace": OWN["namespace"]},
        "stringData": {"tls.key": "garbage"},
    }
    # A token minted there for the agent's ServiceAccount could impersonate anyone.
    minted = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/service-account-token",
        "metadata": {
            "name": "minted",
            "namespace": OWN["namespace"],
            "annotations": {"kubernetes.io/service-account.name": "tunnel-agent"},
        },
    }
    for name, obj in (("lock-out", overwrite), ("mint", minted)):
        done = await cluster.run("manifests", name, {"objects": [obj]})
        assert done["state"] == "failed"
        assert REFUSED in done["error"]
    assert cluster.stub.get("v1", "Secret", OWN["name"], OWN["namespace"]) is None
    assert cluster.stub.get("v1", "Secret", "minted", OWN["namespace"]) is None
    # Nor as the Secret a command writes its outputs to.
    spec = {"git": {"url": "file:///nowhere", "ref": "main", "path": "infra"}}
    done = await cluster.run("tofu", "outputs", spec, outputsSecret=OWN)
    assert done["state"] == "failed"
    assert REFUSED in done["error"]
