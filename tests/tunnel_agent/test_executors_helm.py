"""The helm executor against the fake ``helm`` (tests/fakebin) and the stand-in API server."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.fakebin import fake_environment, process_gone, records, wait_gone
from tests.fakebin.support import Harness, command, harness
from tests.tunnel_agent.file_sources import allowing_file_sources
from tunnel_agent.executors import execute

SECRET = "s3cr3t-Pa55w0rd"
REPO_CHART = {"repo": "https://charts.example.com", "name": "web", "version": "1.2.3"}
PASSWORD_REF = {"secretRef": {"namespace": "vault", "name": "db", "key": "password"}}


@pytest.fixture
async def h(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Harness]:
    async with harness(tmp_path) as running:
        allowing_file_sources(running, monkeypatch)
        running.stub.add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "vault"}})
        running.add_secret("vault", "db", {"password": SECRET})
        yield running


def _helm(**spec: Any) -> dict[str, Any]:
    return {"namespace": "web", "chart": REPO_CHART} | spec


def _exists(path: str) -> bool:
    return Path(path).exists()


def _values_file(call: dict[str, Any]) -> Path:
    argv = call["argv"]
    return Path(argv[argv.index("--values") + 1])


async def test_the_command_line_is_exactly_helms_upgrade_install(
    h: Harness, tmp_path: Path
) -> None:
    record = tmp_path / "record.jsonl"
    context = h.context(fake_environment(record))
    spec = _helm(wait=True, atomic=True, timeout="5m", createNamespace=True)
    result = await execute(command("helm", spec), context)
    assert result.outcome == "succeeded", result.error
    [call] = records(record)
    values_file = str(_values_file(call))
    assert call["argv"] == [
        "upgrade", "--install", "web-app", "web", "--namespace", "web", "--create-namespace",
        "--values", values_file, "--version", "1.2.3", "--repo", "https://charts.example.com",
        "--wait", "--atomic", "--timeout", "5m",
    ]  # fmt: skip
    assert _values_file(call).parent == context.workdir
    assert call["values_mode"] == "0o600"
    assert not _values_file(call).exists()
    # Its kubeconfig is the gateway's, for this run only; never the agent's.
    assert Path(call["env"]["KUBECONFIG"]).parent == context.workdir
    assert not _exists(call["env"]["KUBECONFIG"])
    assert call["env"]["HELM_CACHE_HOME"].startswith(str(context.workdir))
    assert call["pgid"] == call["pid"]  # its own process group


async def test_values_are_resolved_into_the_file_and_never_on_the_command_line(
    h: Harness, tmp_path: Path
) -> None:
    record = tmp_path / "record.jsonl"
    values = {"replicas": 2, "db": {"user": "app", "password": PASSWORD_REF}}
    result = await execute(
        command("helm", _helm(values=values)), h.context(fake_environment(record))
    )
    assert result.outcome == "succeeded", result.error
    [call] = records(record)
    assert json.loads(call["values"]) == {
        "replicas": 2,
        "db": {"user": "app", "password": SECRET},
    }
    assert not any(SECRET in argument for argument in call["argv"])
    assert SECRET not in json.dumps(result.to_dict())


async def test_the_summary_reports_release_revision_and_status(h: Harness, tmp_path: Path) -> None:
    environment = fake_environment(tmp_path / "record.jsonl", FAKEBIN_REVISION="7")
    result = await execute(command("helm", _helm()), h.context(environment))
    assert result.summary == {
        "type": "helm",
        "release": "web-app",
        "namespace": "web",
        "chart": "https://charts.example.com web 1.2.3",
        "revision": 7,
        "status": "deployed",
    }
    assert 'Release "web-app" has been upgraded. Happy Helming!' in h.lines


async def test_an_oci_chart_is_passed_as_the_chart_with_its_version(
    h: Harness, tmp_path: Path
) -> None:
    record = tmp_path / "record.jsonl"
    chart = {"oci": "oci://registry.example.com/charts/web", "version": "2.0.0"}
    result = await execute(
        command("helm", _helm(chart=chart, release="front")), h.context(fake_environment(record))
    )
    assert result.outcome == "succeeded", result.error
    [call] = records(record)
    assert call["argv"][:5] == [
        "upgrade",
        "--install",
        "front",
        "oci://registry.example.com/charts/web",
        "--namespace",
    ]
    assert call["argv"][-2:] == ["--version", "2.0.0"]
    assert "--repo" not in call["argv"]


def _git_repository(path: Path, files: dict[str, str]) -> str:
    """A git repository at ``path`` with ``files`` committed on ``main``; its file:// URL."""
    path.mkdir()
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@example.com", "-C", str(path)]
    subprocess.run(["git", "init", "--quiet", "-b", "main", str(path)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "--quiet", "-m", "chart"], check=True)
    return f"file://{path}"


async def test_a_git_chart_is_fetched_and_passed_as_a_directory(h: Harness, tmp_path: Path) -> None:
    url = _git_repository(
        tmp_path / "charts",
        {"charts/web/Chart.yaml": "apiVersion: v2\nname: web\nversion: 1.0.0\n"},
    )
    record = tmp_path / "record.jsonl"
    chart = {"git": {"url": url, "ref": "main", "path": "charts/web"}}
    context = h.context(fake_environment(record))
    result = await execute(command("helm", _helm(chart=chart)), context)
    assert result.outcome == "succeeded", result.error
    [call] = records(record)
    chart_dir = Path(call["argv"][3])
    assert chart_dir.is_relative_to(context.workdir)
    assert (chart_dir / "Chart.yaml").read_text().startswith("apiVersion: v2")


async def test_a_git_path_without_a_chart_fails_naming_the_field(
    h: Harness, tmp_path: Path
) -> None:
    url = _git_repository(tmp_path / "charts", {"README.md": "no chart here\n"})
    chart = {"git": {"url": url, "ref": "main"}}
    record = tmp_path / "record.jsonl"
    result = await execute(command("helm", _helm(chart=chart)), h.context(fake_environment(record)))
    assert result.outcome == "failed"
    assert result.error == "spec.chart.git.path: no Chart.yaml in '.'"
    assert records(record) == []


async def test_an_unknown_git_ref_fails_naming_the_field(h: Harness, tmp_path: Path) -> None:
    url = _git_repository(tmp_path / "charts", {"Chart.yaml": "name: web\n"})
    chart = {"git": {"url": url, "ref": "no-such-branch"}}
    result = await execute(
        command("helm", _helm(chart=chart)), h.context(fake_environment(tmp_path / "r.jsonl"))
    )
    assert result.outcome == "failed"
    assert result.error is not None
    assert result.error.startswith(f"spec.chart.git: cannot fetch {url} at no-such-branch: ")


async def test_log_lines_that_show_a_secret_are_masked(h: Harness, tmp_path: Path) -> None:
    environment = fake_environment(tmp_path / "record.jsonl", FAKEBIN_PRINT_VALUES="1")
    values = {"db": {"password": PASSWORD_REF}}
    result = await execute(command("helm", _helm(values=values)), h.context(environment))
    assert result.outcome == "succeeded", result.error
    assert '"password": "***"' in h.log_text()
    assert SECRET not in h.log_text()


async def test_a_failing_helm_gives_a_failed_result_with_its_error(
    h: Harness, tmp_path: Path
) -> None:
    record = tmp_path / "record.jsonl"
    environment = fake_environment(record, FAKEBIN_FAIL="upgrade")
    result = await execute(
        command("helm", _helm(values={"p": PASSWORD_REF})), h.context(environment)
    )
    assert result.outcome == "failed"
    assert result.error == (
        "spec: helm upgrade --install web-app failed (exit 1): "
        "Error: UPGRADE FAILED: release web-app failed: chart not found"
    )
    [call] = records(record)
    assert _values_file(call).parent.is_dir()
    assert not _values_file(call).exists()


async def test_helm_missing_from_the_path_is_a_failed_result(h: Harness, tmp_path: Path) -> None:
    environment = fake_environment(tmp_path / "record.jsonl", fakes=False)
    environment["PATH"] = str(tmp_path / "empty-bin")
    result = await execute(command("helm", _helm()), h.context(environment))
    assert (result.outcome, result.error) == ("failed", "helm is not on the agent's PATH")


async def test_a_missing_secret_fails_naming_the_value(h: Harness, tmp_path: Path) -> None:
    missing = {"secretRef": {"namespace": "vault", "name": "nope", "key": "password"}}
    record = tmp_path / "record.jsonl"
    result = await execute(
        command("helm", _helm(values={"db": {"password": missing}})),
        h.context(fake_environment(record)),
    )
    assert result.outcome == "failed"
    assert result.error == "spec.values.db.password: secret vault/nope not found"
    assert records(record) == []


async def test_a_missing_secret_key_fails_naming_the_value(h: Harness, tmp_path: Path) -> None:
    missing = {"secretRef": {"namespace": "vault", "name": "db", "key": "token"}}
    result = await execute(
        command("helm", _helm(values={"token": missing})),
        h.context(fake_environment(tmp_path / "r.jsonl")),
    )
    assert result.error == "spec.values.token: secret vault/db has no key 'token'"


async def test_a_secret_the_agent_may_not_read_fails_saying_so(h: Harness, tmp_path: Path) -> None:
    h.stub.deny(verb="get", resource="secrets")
    result = await execute(
        command("helm", _helm(values={"p": PASSWORD_REF})),
        h.context(fake_environment(tmp_path / "r.jsonl")),
    )
    assert result.error == (
        "spec.values.p: the agent may not read secret vault/db (HTTP 403); grant it get on secrets"
    )


async def _start_hanging(
    h: Harness, tmp_path: Path, **settings: str
) -> tuple[asyncio.Task[Any], dict[str, int], Path]:
    pids_file = tmp_path / "pids.json"
    record = tmp_path / "record.jsonl"
    environment = fake_environment(record, FAKEBIN_HANG="upgrade", FAKEBIN_PIDS=str(pids_file))
    environment |= settings
    context = h.context(environment, kill_grace=0.2)
    task = asyncio.create_task(execute(command("helm", _helm(values={"p": PASSWORD_REF})), context))
    await h.line_seen("hanging").wait()
    [call] = records(record)
    return task, json.loads(pids_file.read_text()), _values_file(call)


async def test_cancelling_kills_helm_and_its_children_and_removes_the_values(
    h: Harness, tmp_path: Path
) -> None:
    task, pids, values_file = await _start_hanging(h, tmp_path)
    assert not process_gone(pids["pid"])
    assert values_file.exists()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert process_gone(pids["pid"])
    assert await wait_gone(pids["child"])
    assert not values_file.exists()


async def test_a_process_that_ignores_sigterm_is_killed_after_the_grace(
    h: Harness, tmp_path: Path
) -> None:
    task, pids, _ = await _start_hanging(h, tmp_path, FAKEBIN_IGNORE_TERM="1")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert process_gone(pids["pid"])
    assert await wait_gone(pids["child"])


async def test_the_command_timeout_stops_helm_and_fails(h: Harness, tmp_path: Path) -> None:
    pids_file = tmp_path / "pids.json"
    environment = fake_environment(
        tmp_path / "record.jsonl", FAKEBIN_HANG="upgrade", FAKEBIN_PIDS=str(pids_file)
    )
    result = await execute(
        command("helm", _helm(), timeout="1s"), h.context(environment, kill_grace=0.2)
    )
    assert (result.outcome, result.error) == ("failed", "timed out after 1s")
    pids = json.loads(pids_file.read_text())
    assert process_gone(pids["pid"])
    assert await wait_gone(pids["child"])


async def test_helm_reaches_the_cluster_through_the_gateway_and_not_the_agents_namespace(
    h: Harness, tmp_path: Path
) -> None:
    """A chart's ``lookup`` of the agent's key is refused; helm's own reads go through."""
    h.stub.add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "tunnel-agent"}})
    h.add_secret("tunnel-agent", "agent-credentials", {"tls.key": "the agent's key"})
    record = tmp_path / "record.jsonl"
    requests = [
        ["GET", "/api/v1/namespaces/tunnel-agent/secrets/agent-credentials"],
        ["GET", "/api/v1/namespaces/vault/secrets/db"],
    ]
    environment = fake_environment(
        record,
        FAKEBIN_REQUESTS=json.dumps(requests),
        KUBERNETES_SERVICE_HOST="10.96.0.1",
        KUBERNETES_SERVICE_PORT="443",
    )
    context = h.context(environment, own_namespace="tunnel-agent")
    result = await execute(command("helm", _helm()), context)
    assert result.outcome == "succeeded", result.error
    [call] = records(record)
    [refused, allowed] = call["answers"]
    assert refused[0] == 403
    assert "namespace tunnel-agent is the agent's own" in refused[1]["message"]
    assert allowed[0] == 200
    assert allowed[1]["metadata"]["name"] == "db"
    assert call["server"].startswith("http://127.0.0.1:")
    assert call["token"] != h.stub.token
    # Nothing would lead helm to the pod's ServiceAccount by itself.
    assert "KUBERNETES_SERVICE_HOST" not in call["env_names"]
    assert "KUBERNETES_SERVICE_PORT" not in call["env_names"]
    # Its token ended with it.
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            call["server"] + "/api/v1/namespaces",
            headers={"Authorization": f"Bearer {call['token']}"},
        ) as response,
    ):
        assert response.status == 401


async def test_helm_does_not_run_without_the_gateway(h: Harness, tmp_path: Path) -> None:
    record = tmp_path / "record.jsonl"
    context = h.context(fake_environment(record), gateway=None)
    result = await execute(command("helm", _helm()), context)
    assert result.outcome == "failed"
    assert result.error is not None
    assert "helm runs only through the agent's gateway" in result.error
    assert records(record) == []
