"""``execute``: run one command to a result, whatever happens short of cancellation."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from tunnel_commands import Command
from tunnel_commands.durations import format_duration

from .context import MAX_SUMMARY_BYTES, ExecutionContext, ExecutionResult, summary_size
from .errors import ExecutorError
from .flow import run_spec
from .git import file_source_refusal
from .kube import KubeClient
from .outputs import OutputWriter
from .secrets import SecretResolver, ValueResolver
from .steps import Step, StepReport

__all__ = ["execute"]

logger = logging.getLogger(__name__)

_MAX_ERROR = 4096
_UNEXPECTED = "the agent failed unexpectedly running this command; see the agent's log"
#: How long writing the outputs may take, even after the command's timeout.
_OUTPUT_WRITE_TIMEOUT = 60


async def execute(command: Command, context: ExecutionContext) -> ExecutionResult:
    """Run ``command`` within its timeout; a failed result for anything that goes wrong.

    Only cancellation propagates (after every process started is stopped).
    Outputs produced before a failure or timeout are still written.
    """
    client = KubeClient(context.kube, context.identity)
    secrets = SecretResolver(client, context.masker, context.check_not_own)
    step = Step(context, client, ValueResolver(secrets, context.masker), "spec", context.workdir)
    context.emit(f"{command.type} command {command.name}: attempt {context.attempt} started")
    report: StepReport | None = None
    error: str | None = None
    timer = asyncio.timeout(command.timeout)
    if context.deadline is None:
        context.deadline = asyncio.get_running_loop().time() + command.timeout
    try:
        async with timer:
            refusal = None if context.allow_file_git_sources else file_source_refusal(command)
            if refusal is not None:
                raise ExecutorError(refusal)
            target = command.outputs_secret
            if target is not None:
                context.check_not_own(target.namespace, "outputsSecret")
            report = await run_spec(command.spec, step)
    except ExecutorError as exc:
        error = str(exc)
    except Exception as exc:  # a bug in one command must not stop the agent: logged, failed
        if isinstance(exc, TimeoutError) and timer.expired():
            error = f"timed out after {format_duration(command.timeout)}"
        else:
            logger.exception("command %s failed unexpectedly", context.command_id)
            error = _UNEXPECTED
    if report is not None:
        error = error or report.error
        if command.type != "flow":
            step.collected.update(report.outputs)
    outputs = await _write_outputs(command, client, step, context)
    if isinstance(outputs, str):
        error = f"{error}; {outputs}" if error else outputs
        outputs = []
    summary = _bounded(context, {"type": command.type} | (report.summary if report else {}))
    if error is not None:
        error = context.masker.mask(error)
        if len(error) > _MAX_ERROR:
            error = error[: _MAX_ERROR - 3] + "..."
        context.emit(f"failed: {error}")
        return ExecutionResult("failed", summary, outputs, error)
    context.emit("succeeded")
    return ExecutionResult("succeeded", summary, outputs)


async def _write_outputs(
    command: Command, client: KubeClient, step: Step, context: ExecutionContext
) -> list[str] | str:
    """The names written, or why they could not be."""
    if not step.collected:
        return []
    if command.outputs_secret is None:
        context.emit(
            f"outputs {', '.join(sorted(step.collected))} are not stored: "
            "the command names no outputsSecret"
        )
        return []
    writer = OutputWriter(client, command.outputs_secret)
    try:
        async with asyncio.timeout(_OUTPUT_WRITE_TIMEOUT):
            names = await writer.write(
                {name: value.as_text() for name, value in step.collected.items()}
            )
    except ExecutorError as exc:
        return str(exc)
    except TimeoutError:
        return "timed out writing the outputs"
    target = command.outputs_secret
    context.emit(f"outputs {', '.join(names)} written to {target.namespace}/{target.name}")
    return names


def _bounded(context: ExecutionContext, summary: dict[str, Any]) -> dict[str, Any]:
    """``summary`` with every string masked, or a marker if it is too large."""
    masked = _mask(context, summary)
    assert isinstance(masked, dict)
    if summary_size(masked) > MAX_SUMMARY_BYTES:
        return {"type": summary.get("type"), "truncated": True}
    return masked


def _mask(context: ExecutionContext, value: Any) -> Any:
    if isinstance(value, str):
        return context.masker.mask(value)
    if isinstance(value, dict):
        return {context.masker.mask(str(k)): _mask(context, v) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask(context, item) for item in value]
    return value
