"""Flows: steps in order, outputs feeding later steps, stopping or going on after a failure."""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakebin import fake_environment, records
from tests.fakebin.support import Harness, command, harness
from tests.tunnel_agent.file_sources import allowing_file_sources
from tunnel_agent.executors import execute

GENERATED = "gen-Pa55-7f3a9c"
OUTPUTS = {"outputsSecret": {"namespace": "default", "name": "stack-outputs"}}


@pytest.fixture
async def h(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Harness]:
    async with harness(tmp_path) as running:
        allowing_file_sources(running, monkeypatch)
        yield running


@pytest.fixture
def repository(tmp_path: Path) -> str:
    path = tmp_path / "repository"
    path.mkdir()
    (path / "main.tf").write_text('resource "terraform_data" "x" {}\n')
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@example.com", "-C", str(path)]
    subprocess.run(["git", "init", "--quiet", "-b", "main", str(path)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "--quiet", "-m", "infra"], check=True)
    return f"file://{path}"


def _tofu_step(url: str, **extra: Any) -> dict[str, Any]:
    return {"name": "infra", "type": "tofu", "git": {"url": url, "ref": "main"}} | extra


def _helm_step(name: str = "app", **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "type": "helm",
        "namespace": "default",
        "chart": {"oci": "oci://registry.example.com/charts/web"},
        "values": {
            "db": {
                "host": {"outputRef": {"step": "infra", "output": "endpoint"}},
                "password": {"outputRef": {"step": "infra", "output": "password"}},
            }
        },
    } | extra


def _configmap_step(name: str) -> dict[str, Any]:
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}
    return {"name": name, "type": "manifests", "namespace": "default", "objects": [config]}


def _environment(tmp_path: Path, **settings: str) -> dict[str, str]:
    environment = fake_environment(
        tmp_path / "record.jsonl",
        FAKEBIN_PRINT_VALUES="1",
        TF_VAR_db_password=GENERATED,  # the fake tofu's sensitive output takes this value
    )
    return environment | settings


async def test_outputs_of_a_step_feed_later_steps_and_the_outputs_secret(
    h: Harness, tmp_path: Path, repository: str
) -> None:
    steps = [_tofu_step(repository), _helm_step(), _configmap_step("after")]
    cmd = command("flow", {"steps": steps}, name="stack", **OUTPUTS)
    result = await execute(cmd, h.context(_environment(tmp_path)))
    assert result.outcome == "succeeded", result.error
    helm = next(call for call in records(tmp_path / "record.jsonl") if call["tool"] == "helm")
    assert json.loads(helm["values"]) == {"db": {"host": "db.internal:5432", "password": GENERATED}}
    assert helm["argv"][2] == "stack-app"
    assert result.outputs == ["infra.endpoint", "infra.password"]
    assert h.secret_data("default", "stack-outputs") == {
        "infra.endpoint": "db.internal:5432",
        "infra.password": GENERATED,
    }
    assert [(s["name"], s["outcome"]) for s in result.summary["steps"]] == [
        ("infra", "succeeded"),
        ("app", "succeeded"),
        ("after", "succeeded"),
    ]
    assert GENERATED not in h.log_text()  # the fake helm printed it: masked
    assert GENERATED not in json.dumps(result.to_dict())


async def test_a_failed_step_stops_the_flow_and_the_rest_is_skipped(
    h: Harness, tmp_path: Path, repository: str
) -> None:
    steps = [_tofu_step(repository), _helm_step(), _configmap_step("after")]
    cmd = command("flow", {"steps": steps}, name="stack", **OUTPUTS)
    result = await execute(cmd, h.context(_environment(tmp_path, FAKEBIN_FAIL="upgrade")))
    assert result.outcome == "failed"
    assert result.error is not None
    assert result.error.startswith(
        "step app failed: spec.steps[1]: helm upgrade --install stack-app failed (exit 1): "
    )
    assert [(s["name"], s["outcome"]) for s in result.summary["steps"]] == [
        ("infra", "succeeded"),
        ("app", "failed"),
        ("after", "skipped"),
    ]
    assert h.stub.get("v1", "ConfigMap", "after", "default") is None
    # What the first step produced is kept all the same.
    assert result.outputs == ["infra.endpoint", "infra.password"]


async def test_a_step_that_continues_on_error_lets_the_flow_go_on(
    h: Harness, tmp_path: Path, repository: str
) -> None:
    steps = [
        _tofu_step(repository),
        _helm_step(continueOnError=True),
        _configmap_step("after"),
    ]
    cmd = command("flow", {"steps": steps}, name="stack")
    result = await execute(cmd, h.context(_environment(tmp_path, FAKEBIN_FAIL="upgrade")))
    assert result.outcome == "succeeded", result.error
    assert [s["outcome"] for s in result.summary["steps"]] == ["succeeded", "failed", "succeeded"]
    assert h.stub.get("v1", "ConfigMap", "after", "default") is not None


async def test_an_output_of_a_failed_step_is_not_available_to_later_steps(
    h: Harness, tmp_path: Path, repository: str
) -> None:
    steps = [_tofu_step(repository, continueOnError=True), _helm_step()]
    cmd = command("flow", {"steps": steps}, name="stack")
    result = await execute(cmd, h.context(_environment(tmp_path, FAKEBIN_FAIL="apply")))
    assert result.outcome == "failed"
    assert result.summary["steps"][1]["error"] == (
        "spec.steps[1].values.db.host: step 'infra' gave no outputs (did it fail?)"
    )


async def test_an_output_a_step_did_not_produce_fails_the_step_using_it(
    h: Harness, tmp_path: Path, repository: str
) -> None:
    values = {"x": {"outputRef": {"step": "infra", "output": "nope"}}}
    steps = [_tofu_step(repository), _helm_step(values=values)]
    result = await execute(
        command("flow", {"steps": steps}, name="stack"), h.context(_environment(tmp_path))
    )
    assert result.error == (
        "step app failed: spec.steps[1].values.x: step 'infra' has no output 'nope'"
    )
