"""The agent's command service: the runner, fed by the executors.

Joins :mod:`tunnel_agent.runner` (offers, journal, reports) to
:mod:`tunnel_agent.executors` (what each command type does) and to the
shared spec validation of :mod:`tunnel_commands`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tunnel_commands import CommandSpecError, parse_command
from tunnel_commands.flow import FlowSpec
from tunnel_commands.spec import ALL_COMMAND_TYPES

from .executors import ExecutionContext, execute, file_source_refusal, subprocess_environment
from .executors.gateway import CommandsGateway
from .executors.jobspec import JobSettings
from .journal import Journal
from .kubeapi import KubeApi
from .runner import CommandRunner, JobContext, RunnerSettings

__all__ = ["build_command_runner", "validate_spec"]


def validate_spec(
    spec: dict[str, Any],
    *,
    read_only: bool = False,
    command_types: frozenset[str] = ALL_COMMAND_TYPES,
    allow_file_git_sources: bool = False,
) -> None:
    """Raise ValueError, naming the field, unless ``spec`` is a valid command this agent runs.

    A read-only agent runs queries only: every other type changes the cluster.
    ``command_types`` are the types the cluster's owner lets the agent run
    (a flow's steps included). A ``file://`` git source is a path in the agent's
    own pod: refused unless ``allow_file_git_sources`` (its
    ``--allow-file-git-sources``).
    """
    try:
        command = parse_command(spec)
    except CommandSpecError as exc:
        raise ValueError(str(exc)) from exc
    if read_only and command.type != "query":
        raise ValueError(
            f"this agent is read-only: it runs query commands only, not {command.type}"
        )
    used = {command.type}
    if isinstance(command.spec, FlowSpec):
        used.update(step.type for step in command.spec.steps)
    refused = sorted(used - command_types)
    if refused:
        raise ValueError(
            f"this agent does not run {', '.join(refused)} commands; it runs "
            f"{', '.join(sorted(command_types))} (its --command-types)"
        )
    refusal = None if allow_file_git_sources else file_source_refusal(command)
    if refusal is not None:
        raise ValueError(refusal)


def build_command_runner(
    kube: KubeApi,
    journal: Journal,
    *,
    gateway: CommandsGateway,
    namespace: str,
    kubeconfig: Path | None,
    settings: RunnerSettings | None = None,
    environment: dict[str, str] | None = None,
    read_only: bool = False,
    command_types: frozenset[str] = ALL_COMMAND_TYPES,
    masked_values: tuple[str, ...] = (),
    own_namespace: str | None = None,
    allow_file_git_sources: bool = False,
    jobs: JobSettings | None = None,
) -> CommandRunner:
    """A runner whose jobs run through the executors, each as the identity its offer names.

    ``environment`` is the base environment of helm, tofu and git (by default
    the part of the agent's own that executors pass on); each run gets a home
    directory of its own in it. ``masked_values`` (the bootstrap token) and the
    agent's service-account token are masked in every run's log and result,
    as the values a spec's ``secretRef`` reads are. ``own_namespace`` (in a
    cluster) holds the agent's Secrets: no command reads or writes in it.
    ``allow_file_git_sources`` lets git sources be ``file://`` paths in the
    agent's pod (refused otherwise, when offered and again when run).
    ``gateway`` is how helm and tofu reach the API server, with a credential
    of their run's identity; its owner closes it. ``jobs`` (in a cluster) runs
    their steps as Jobs, away from the agent's credentials.
    """

    async def run(spec: dict[str, Any], job: JobContext) -> dict[str, Any]:
        base = dict(environment) if environment is not None else subprocess_environment()
        home = job.workdir / "home"
        home.mkdir(exist_ok=True)
        context = ExecutionContext(
            command_id=job.command_id,
            attempt=job.attempt,
            kube=kube,
            workdir=job.workdir,
            log=job.log,
            kubeconfig=kubeconfig,
            namespace=namespace,
            # Nothing one run leaves in its home (a .gitconfig) reaches the next.
            environment=base | {"HOME": str(home)},
            own_namespace=own_namespace,
            allow_file_git_sources=allow_file_git_sources,
            gateway=gateway,
            identity=job.identity,
            jobs=jobs,
        )
        for secret in (*masked_values, *_bearer(await kube.authorization())):
            context.masker.add(secret)
        result = await execute(parse_command(spec), context)
        return {
            "outcome": result.outcome,
            "summary": result.summary,
            "outputs": list(result.outputs),
            "error": result.error,
        }

    def validate(spec: dict[str, Any]) -> None:
        validate_spec(
            spec,
            read_only=read_only,
            command_types=command_types,
            allow_file_git_sources=allow_file_git_sources,
        )

    return CommandRunner(run, validate, journal, settings)


def _bearer(authorization: str | None) -> tuple[str, ...]:
    """The token of an ``Authorization: Bearer`` value, if any."""
    scheme, _, token = (authorization or "").partition(" ")
    return (token.strip(),) if scheme.lower() == "bearer" and token.strip() else ()
