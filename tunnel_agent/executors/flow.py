"""Run ``type: flow``, and route any spec to its type's executor.

Steps run in order, each in its own directory under the run's. A failed step
stops the flow unless it continues on error; the steps after a stop are
reported as skipped. Each step's summary is kept if it fits its share of
the result's size, else marked truncated. A step's outputs are kept for later steps'
``outputRef`` (in memory, never sent) and stored as ``<step>.<output>``.
"""

from __future__ import annotations

from typing import Any

from tunnel_commands import (
    CommandSpec,
    FlowSpec,
    HelmSpec,
    ManifestsSpec,
    QuerySpec,
    StepSpec,
    TofuSpec,
)
from tunnel_commands.errors import join_path

from .context import MAX_SUMMARY_BYTES, summary_size
from .errors import ExecutorError
from .helm import run_helm
from .manifests import run_manifests
from .query import run_query
from .secrets import OutputValue, ValueResolver
from .steps import Step, StepReport
from .tofu import run_tofu

__all__ = ["run_flow", "run_spec"]


async def run_spec(spec: CommandSpec, step: Step) -> StepReport:
    """Run ``spec`` with its type's executor."""
    if isinstance(spec, FlowSpec):
        return await run_flow(spec, step)
    return await _run_step(spec, step)


async def _run_step(spec: StepSpec, step: Step) -> StepReport:
    if isinstance(spec, ManifestsSpec):
        return await run_manifests(spec, step)
    if isinstance(spec, HelmSpec):
        return await run_helm(spec, step)
    if isinstance(spec, TofuSpec):
        return await run_tofu(spec, step)
    if isinstance(spec, QuerySpec):
        return await run_query(spec, step)
    raise ExecutorError(f"{step.path}: this agent cannot run {type(spec).__name__}")


async def run_flow(spec: FlowSpec, step: Step) -> StepReport:
    finished: dict[str, dict[str, OutputValue]] = {}
    values = ValueResolver(step.values.secrets, step.values.masker, finished)
    reports: list[dict[str, Any]] = []
    failure: str | None = None
    for index, flow_step in enumerate(spec.steps):
        entry: dict[str, Any] = {"name": flow_step.name, "type": flow_step.type}
        reports.append(entry)
        if failure is not None:
            entry["outcome"] = "skipped"
            continue
        workdir = step.workdir / "steps" / flow_step.name
        workdir.mkdir(parents=True)
        inner = Step(
            step.context,
            step.client,
            values,
            join_path(step.path_of("steps"), index),
            workdir,
            step.collected,
        )
        step.emit(f"step {flow_step.name} ({flow_step.type}): started")
        try:
            report = await _run_step(flow_step.spec, inner)
        except ExecutorError as exc:
            entry |= {"outcome": "failed", "error": str(exc)}
            step.emit(f"step {flow_step.name}: failed: {exc}")
            if not flow_step.continue_on_error:
                failure = f"step {flow_step.name} failed: {exc}"
            continue
        fits = summary_size(report.summary) <= MAX_SUMMARY_BYTES // (2 * len(spec.steps))
        entry |= {
            "outcome": "succeeded",
            "summary": report.summary if fits else {"truncated": True},
        }
        finished[flow_step.name] = report.outputs
        for name, output in report.outputs.items():
            step.collected[f"{flow_step.name}.{name}"] = output
        step.emit(f"step {flow_step.name}: succeeded")
    return StepReport({"steps": reports}, error=failure)
