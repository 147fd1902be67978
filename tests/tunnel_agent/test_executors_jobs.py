"""In a cluster, helm and tofu steps run as Jobs: no token mounted, restricted, bounded.

The stand-in runs each Job's pod as a local process (``stub.jobs``), the way a
kubelet would run the agent's image: ``tunnel-agent step`` with the step's
document mounted from a Secret. The fakes of tests/fakebin are the image's
helm and tofu.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakebin import FAKEBIN, fake_environment, process_gone, records, wait_gone
from tests.fakebin.support import Harness, command, harness
from tests.tunnel_agent.file_sources import allowing_file_sources
from tests.tunnel_agent.test_executors_tofu import make_repository
from tunnel_agent.executors import execute
from tunnel_agent.executors.jobspec import JobSettings
from tunnel_agent.executors.process import MARK_VARIABLE
from tunnel_agent.identity import RunIdentity

OWN = "tunnel-agent"
ALICE = RunIdentity("tunnel:alice", ("tunnel:dev",))
SECRET = "s3cr3t-Pa55w0rd"
PASSWORD_REF = {"secretRef": {"namespace": "vault", "name": "db", "key": "password"}}


@pytest.fixture
async def h(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Harness]:
    async with harness(tmp_path) as running:
        allowing_file_sources(running, monkeypatch)
        for namespace in (OWN, "vault", "web"):
            running.stub.add(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
            )
        running.add_secret("vault", "db", {"password": SECRET})
        running.stub.jobs.enabled = True
        running.stub.jobs.image_entrypoint = ["tunnel-agent"]
        yield running


def _image(record: Path, **settings: str) -> dict[str, str]:
    """The image's environment: the fakes and tunnel-agent on PATH, the fakes' settings."""
    path = os.pathsep.join([str(FAKEBIN), str(Path(sys.executable).parent), os.defpath])
    return fake_environment(record) | settings | {"PATH": path}


def _context(h: Harness, **options: Any) -> Any:
    jobs = JobSettings("registry.example.com/tunnel-agent:1", OWN)
    options.setdefault("identity", ALICE)
    return h.context(
        jobs=jobs, own_namespace=OWN, namespace=OWN, kill_grace=0.2, poll_interval=0.05, **options
    )


async def test_a_helm_step_runs_in_a_job_without_a_token_restricted_and_bounded(
    h: Harness, tmp_path: Path
) -> None:
    record = tmp_path / "record.jsonl"
    h.stub.jobs.image_environment = _image(record)
    spec = {
        "namespace": "web",
        "chart": {"repo": "https://charts.example.com", "name": "web", "version": "1.0.0"},
        "values": {"password": PASSWORD_REF},
    }
    result = await execute(command("helm", spec, timeout="10m"), _context(h))
    assert result.outcome == "succeeded", (result.error, h.lines[-20:])
    [pod] = h.stub.jobs.specs
    assert pod["automountServiceAccountToken"] is False
    assert pod["restartPolicy"] == "Never"
    assert pod["securityContext"]["runAsNonRoot"] is True
    [container] = pod["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert set(container["resources"]["limits"]) == {"cpu", "memory", "ephemeral-storage"}
    assert "command" not in container  # the image's: tini, then tunnel-agent
    assert container["args"][0] == "step"
    assert not [v for v in pod["volumes"] if "projected" in v or "serviceAccountToken" in v]
    # The secret value never appears in the Job's spec, only in its Secret (deleted after).
    assert SECRET not in json.dumps(pod)
    job = h.stub.store.list(_jobs_kind(), OWN)
    assert job == []
    assert h.stub.store.list(_secrets_kind(), OWN) == []
    # Helm ran in the pod with the run's kubeconfig, and none of the agent's environment.
    [call] = records(record)
    assert call["argv"][:3] == ["upgrade", "--install", "web-app"]
    assert "KUBERNETES_SERVICE_HOST" not in call["env_names"]
    assert [n for n in call["env_names"] if n.startswith("TUNNEL_AGENT")] == [MARK_VARIABLE]
    assert "the agent" not in h.log_text()
    assert SECRET not in h.log_text()


async def test_the_jobs_deadline_is_the_runs_time_left(h: Harness, tmp_path: Path) -> None:
    h.stub.jobs.image_environment = _image(tmp_path / "record.jsonl")
    spec = {"namespace": "web", "chart": {"oci": "oci://registry.example.com/web"}}
    result = await execute(command("helm", spec, timeout="2m"), _context(h))
    assert result.outcome == "succeeded", result.error
    [job] = h.stub.jobs.jobs
    # The Job's deadline, as created: at most the run's two minutes.
    assert 0 < job["spec"]["activeDeadlineSeconds"] <= 120
    assert job["spec"]["backoffLimit"] == 0
    assert job["metadata"]["namespace"] == OWN


async def test_a_tofu_steps_outputs_come_back_masked_and_are_written_as_the_submitter(
    h: Harness, tmp_path: Path
) -> None:
    record = tmp_path / "record.jsonl"
    h.stub.jobs.image_environment = _image(record)
    url = make_repository(tmp_path / "repository")
    spec = {
        "git": {"url": url, "ref": "main", "path": "infra"},
        "variables": {"db_password": PASSWORD_REF},
    }
    result = await execute(
        command("tofu", spec, outputsSecret={"namespace": "web", "name": "out"}), _context(h)
    )
    assert result.outcome == "succeeded", (result.error, h.lines[-20:])
    assert result.outputs == ["endpoint", "password"]
    assert h.secret_data("web", "out") == {"endpoint": "db.internal:5432", "password": SECRET}
    assert SECRET not in h.log_text()
    # The state stayed in the agent's namespace, through the gateway, as the agent.
    calls = records(record)
    assert [call["argv"][0] for call in calls] == ["init", "apply", "output"]
    assert 'namespace = "tunnel-agent"' in calls[0]["backend_override"]
    writes = h.stub.requests.matching(lambda r: r.path == "/api/v1/namespaces/web/secrets/out")
    assert [r.header("Impersonate-User") for r in writes] == ["tunnel:alice"]


async def test_cancelling_a_run_deletes_its_job_and_stops_its_pod(
    h: Harness, tmp_path: Path
) -> None:
    pids = tmp_path / "pids.json"
    h.stub.jobs.image_environment = _image(
        tmp_path / "record.jsonl", FAKEBIN_HANG="upgrade", FAKEBIN_PIDS=str(pids)
    )
    spec = {"namespace": "web", "chart": {"oci": "oci://registry.example.com/web"}}
    task = asyncio.create_task(execute(command("helm", spec), _context(h)))
    await h.line_seen("hanging").wait()
    assert h.gateway.grants == 1
    hung = json.loads(pids.read_text())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert h.gateway.grants == 0
    assert h.stub.store.list(_jobs_kind(), OWN) == []
    assert await wait_gone(hung["pid"])
    assert process_gone(hung["pid"])


async def test_a_run_past_its_timeout_ends_timed_out_and_its_job_is_gone(
    h: Harness, tmp_path: Path
) -> None:
    h.stub.jobs.image_environment = _image(tmp_path / "record.jsonl", FAKEBIN_HANG="upgrade")
    spec = {"namespace": "web", "chart": {"oci": "oci://registry.example.com/web"}}
    result = await execute(command("helm", spec, timeout="1s"), _context(h))
    assert (result.outcome, result.error) == ("failed", "timed out after 1s")
    assert h.stub.store.list(_jobs_kind(), OWN) == []
    assert h.gateway.grants == 0


def _jobs_kind() -> Any:
    from tests.kubestub.kinds import require_kind

    return require_kind("batch", "v1", "jobs")


def _secrets_kind() -> Any:
    from tests.kubestub.kinds import require_kind

    return require_kind("", "v1", "secrets")


async def test_a_modules_local_exec_in_the_job_finds_no_agent_credential(
    h: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.tunnel_agent.test_run_confinement import PROBE, SERVICE_ACCOUNT_TOKEN

    monkeypatch.setenv("TUNNEL_AGENT_BOOTSTRAP_TOKEN", "tbt_the-agents-bootstrap-token")
    probe, out = tmp_path / "probe.py", tmp_path / "found.json"
    probe.write_text(f"SERVICE_ACCOUNT_TOKEN = {SERVICE_ACCOUNT_TOKEN!r}\n" + PROBE)
    h.stub.deny("tunnel:alice", "get", "secrets", namespace="vault")
    h.stub.jobs.image_environment = _image(
        tmp_path / "record.jsonl", FAKEBIN_LOCAL_EXEC=f"{sys.executable} {probe} {out}"
    )
    url = make_repository(tmp_path / "repository")
    spec = {"git": {"url": url, "ref": "main", "path": "infra"}, "backend": {"local": True}}
    result = await execute(command("tofu", spec), _context(h))
    assert result.outcome == "succeeded", (result.error, h.lines[-20:])
    found: dict[str, Any] = json.loads(out.read_text())
    agent_token = str(await h.kube.authorization()).removeprefix("Bearer ")
    assert agent_token not in json.dumps(found)
    assert "tbt_the-agents-bootstrap-token" not in json.dumps(found)
    assert str(h.kubeconfig) not in json.dumps(found)
    assert [n for n in found["env"] if n.startswith("TUNNEL_AGENT")] == [MARK_VARIABLE]
    assert found["files"][SERVICE_ACCOUNT_TOKEN].startswith("unreadable")
    assert found["own"][0] == 200
    status, refusal = found["secret"]
    assert status == 403
    assert 'User "tunnel:alice" cannot get resource "secrets"' in refusal["message"]
    assert found["as_bob"][0] == 403
