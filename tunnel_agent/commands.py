"""The agent's command service: the runner, fed by the executors.

Joins :mod:`tunnel_agent.runner` (offers, journal, reports) to
:mod:`tunnel_agent.executors` (what each command type does) and to the
shared spec validation of :mod:`tunnel_commands`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tunnel_commands import CommandSpecError, parse_command

from .executors import ExecutionContext, execute, subprocess_environment
from .journal import Journal
from .kubeapi import KubeApi
from .runner import CommandRunner, JobContext, RunnerSettings

__all__ = ["build_command_runner", "validate_spec"]


def validate_spec(spec: dict[str, Any], *, read_only: bool = False) -> None:
    """Raise ValueError, naming the field, unless ``spec`` is a valid command.

    A read-only agent runs queries only: every other type changes the cluster.
    """
    try:
        command = parse_command(spec)
    except CommandSpecError as exc:
        raise ValueError(str(exc)) from exc
    if read_only and command.type != "query":
        raise ValueError(
            f"this agent is read-only: it runs query commands only, not {command.type}"
        )


def build_command_runner(
    kube: KubeApi,
    journal: Journal,
    *,
    namespace: str,
    kubeconfig: Path | None,
    settings: RunnerSettings | None = None,
    environment: dict[str, str] | None = None,
    read_only: bool = False,
) -> CommandRunner:
    """A runner whose jobs run through the executors with the agent's API access.

    ``environment`` is the base environment of helm, tofu and git (by default
    the part of the agent's own that executors pass on).
    """

    async def run(spec: dict[str, Any], job: JobContext) -> dict[str, Any]:
        context = ExecutionContext(
            command_id=job.command_id,
            attempt=job.attempt,
            kube=kube,
            workdir=job.workdir,
            log=job.log,
            kubeconfig=kubeconfig,
            namespace=namespace,
            environment=(
                dict(environment) if environment is not None else subprocess_environment()
            ),
        )
        result = await execute(parse_command(spec), context)
        return {
            "outcome": result.outcome,
            "summary": result.summary,
            "outputs": list(result.outputs),
            "error": result.error,
        }

    def validate(spec: dict[str, Any]) -> None:
        validate_spec(spec, read_only=read_only)

    return CommandRunner(run, validate, journal, settings)
