"""``execute``: every failure becomes a result, masked and bounded."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.fakebin.support import Harness, command, harness
from tunnel_agent.executors import ExecutorError, execute
from tunnel_agent.executors import flow as flow_module
from tunnel_agent.executors.secrets import OutputValue
from tunnel_agent.executors.steps import Step, StepReport
from tunnel_commands import ManifestsSpec, SecretRef

SECRET = "s3cr3t-Pa55w0rd"
CONFIGMAP = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    async with harness(tmp_path) as running:
        running.add_secret("default", "db", {"password": SECRET})
        yield running


async def test_an_unexpected_exception_is_a_failed_result_and_logged(
    h: Harness, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(spec: ManifestsSpec, step: Step) -> StepReport:
        raise RuntimeError("bug")

    monkeypatch.setattr(flow_module, "run_manifests", broken)
    with caplog.at_level(logging.ERROR, logger="tunnel_agent.executors.dispatch"):
        result = await execute(command("manifests", {"objects": [CONFIGMAP]}), h.context())
    assert result.outcome == "failed"
    assert result.error == (
        "the agent failed unexpectedly running this command; see the agent's log"
    )
    assert "command cmd-1 failed unexpectedly" in caplog.text
    assert "RuntimeError: bug" in caplog.text


async def test_a_timeout_error_that_is_not_the_commands_is_a_failed_result(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def timing_out(spec: ManifestsSpec, step: Step) -> StepReport:
        raise TimeoutError

    monkeypatch.setattr(flow_module, "run_manifests", timing_out)
    result = await execute(command("manifests", {"objects": [CONFIGMAP]}), h.context())
    assert result.error == (
        "the agent failed unexpectedly running this command; see the agent's log"
    )


async def test_a_flow_step_summary_over_its_share_is_marked_truncated(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def verbose(spec: ManifestsSpec, step: Step) -> StepReport:
        return StepReport({"applied": ["x" * 1000] * 600})

    monkeypatch.setattr(flow_module, "run_manifests", verbose)
    step = {"type": "manifests", "objects": [CONFIGMAP]}
    steps = [step | {"name": "one"}, step | {"name": "two"}]
    result = await execute(command("flow", {"steps": steps}), h.context())
    assert result.outcome == "succeeded", result.error
    assert [s["summary"] for s in result.summary["steps"]] == [{"truncated": True}] * 2


async def test_a_secret_in_an_error_or_summary_is_masked(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def leaky(spec: ManifestsSpec, step: Step) -> StepReport:
        value = await step.values.resolve(SecretRef("default", "db", "password"), "spec.x")
        raise ExecutorError(f"spec.x: the server said {value!r} is wrong")

    monkeypatch.setattr(flow_module, "run_manifests", leaky)
    result = await execute(command("manifests", {"objects": [CONFIGMAP]}), h.context())
    assert result.error == "spec.x: the server said '***' is wrong"
    assert "failed: spec.x: the server said '***' is wrong" in h.lines


async def test_a_summary_over_the_limit_is_replaced_by_a_marker(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def verbose(spec: ManifestsSpec, step: Step) -> StepReport:
        return StepReport({"applied": ["x" * 1000] * 2000})

    monkeypatch.setattr(flow_module, "run_manifests", verbose)
    result = await execute(command("manifests", {"objects": [CONFIGMAP]}), h.context())
    assert result.outcome == "succeeded"
    assert result.summary == {"type": "manifests", "truncated": True}


async def test_outputs_that_cannot_be_written_fail_the_command(
    h: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def producing(spec: ManifestsSpec, step: Step) -> StepReport:
        return StepReport({}, {"url": OutputValue("https://x")})

    monkeypatch.setattr(flow_module, "run_manifests", producing)
    cmd = command(
        "manifests",
        {"objects": [CONFIGMAP]},
        outputsSecret={"namespace": "no-such-namespace", "name": "out"},
    )
    result = await execute(cmd, h.context())
    assert result.outcome == "failed"
    assert result.outputs == []
    assert result.error is not None
    assert result.error.startswith(
        "cannot write the outputs to outputsSecret no-such-namespace/out: "
    )


async def test_the_run_logs_its_start_and_its_end(h: Harness) -> None:
    result = await execute(
        command("manifests", {"objects": [CONFIGMAP], "namespace": "default"}), h.context()
    )
    assert result.outcome == "succeeded", result.error
    assert h.lines[0] == "manifests command web-app: attempt 1 started"
    assert h.lines[-1] == "succeeded"
