"""Run ``type: helm``: ``helm upgrade --install`` with the values in a private file.

::

    helm upgrade --install RELEASE CHART --namespace NS [--create-namespace]
         --values FILE [--version V] [--repo URL] [--wait] [--atomic] [--timeout T]

The values, references resolved, go to a mode-0600 file in the run's
directory, removed as soon as helm ends; nothing secret is on the command
line. Helm's caches and configuration live in the run's directory too.
Helm never holds the agent's credentials: ``KUBECONFIG`` points it at the
commands' gateway (``gateway``), with a token good while it runs and only as
the command's identity (its submitter), and the in-cluster variables that
would lead it to the ServiceAccount are withheld.
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
from typing import Any

from tunnel_commands import GitChart, HelmSpec, OciChart, RepoChart
from tunnel_commands.durations import format_duration
from tunnel_pki.files import create_private_file

from .errors import ExecutorError, ProcessError
from .git import fetch_source
from .jobs import run_in_job
from .process import find_binary, run_process
from .steps import Step, StepReport

__all__ = ["helm_command", "run_helm"]

#: What would lead helm (client-go) to the pod's ServiceAccount token without a kubeconfig.
_IN_CLUSTER_VARIABLES = frozenset({"KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"})

_REVISION = re.compile(r"^REVISION:\s*(\d+)\s*$")
_STATUS = re.compile(r"^STATUS:\s*(\S+)\s*$")


def helm_command(helm: str, spec: HelmSpec, chart: str, values_file: str) -> list[str]:
    """The command line for ``spec``, with the chart reference already resolved."""
    argv = [helm, "upgrade", "--install", spec.release, chart, "--namespace", spec.namespace]
    if spec.create_namespace:
        argv.append("--create-namespace")
    argv += ["--values", values_file]
    if isinstance(spec.chart, RepoChart | OciChart) and spec.chart.version:
        argv += ["--version", spec.chart.version]
    if isinstance(spec.chart, RepoChart):
        argv += ["--repo", spec.chart.repo]
    if spec.wait:
        argv.append("--wait")
    if spec.atomic:
        argv.append("--atomic")
    if spec.timeout is not None:
        argv += ["--timeout", format_duration(spec.timeout)]
    return argv


async def run_helm(spec: HelmSpec, step: Step) -> StepReport:
    context = step.context
    values = await step.values.resolve(spec.values, step.path_of("values"))
    if context.jobs is not None:
        # The chart and helm's plugins and post-renderers run in a Job, away from
        # the agent's credentials; the values travel resolved (as the submitter).
        return await run_in_job(context.jobs, dataclasses.replace(spec, values=values), step)
    helm = find_binary(["helm"], context.environment)
    chart = await _chart(spec, step)
    home = step.workdir / "helm"
    home.mkdir(parents=True, exist_ok=True)
    if context.gateway is None:
        raise ExecutorError(f"{step.path}: helm runs only through the agent's gateway")
    environment = {
        name: value
        for name, value in context.environment.items()
        if name not in _IN_CLUSTER_VARIABLES
    }
    environment |= {
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    values_file = step.workdir / f"values-{secrets.token_hex(8)}.json"
    revision: list[str] = []
    status: list[str] = []

    def on_line(line: str) -> None:
        if match := _REVISION.match(line):
            revision.append(match.group(1))
        elif match := _STATUS.match(line):
            status.append(match.group(1))
        step.emit(line)

    create_private_file(values_file, json.dumps(values, indent=2).encode())
    try:
        async with context.gateway.kubeconfig(
            step.workdir,
            own_namespace=context.own_namespace,
            label=f"command {context.command_id}",
            identity=context.identity,
            expires=context.deadline,
        ) as kubeconfig:
            result = await run_process(
                helm_command(helm, spec, chart, str(values_file)),
                cwd=step.workdir,
                environment=environment | {"KUBECONFIG": str(kubeconfig)},
                emit=on_line,
                kill_grace=context.kill_grace,
            )
    finally:
        values_file.unlink(missing_ok=True)
    if result.returncode != 0:
        raise ProcessError(
            f"{step.path}: helm upgrade --install {spec.release} failed "
            f"(exit {result.returncode}): {result.last_error}",
            returncode=result.returncode,
        )
    summary: dict[str, Any] = {
        "release": spec.release,
        "namespace": spec.namespace,
        "chart": _describe(spec),
        "revision": int(revision[-1]) if revision else None,
        "status": status[-1] if status else None,
    }
    return StepReport(summary)


async def _chart(spec: HelmSpec, step: Step) -> str:
    chart = spec.chart
    if isinstance(chart, RepoChart):
        return chart.name
    if isinstance(chart, OciChart):
        return chart.oci
    directory = await fetch_source(
        chart.git, step.workdir / "chart-source", step, step.path_of("chart", "git")
    )
    if not (directory / "Chart.yaml").is_file():
        raise ExecutorError(
            f"{step.path_of('chart', 'git', 'path')}: no Chart.yaml in {chart.git.path!r}"
        )
    return str(directory)


def _describe(spec: HelmSpec) -> str:
    chart = spec.chart
    if isinstance(chart, RepoChart):
        return f"{chart.repo} {chart.name} {chart.version or '(latest)'}"
    if isinstance(chart, OciChart):
        return f"{chart.oci} {chart.version or '(latest)'}"
    assert isinstance(chart, GitChart)
    return f"{chart.git.url} {chart.git.ref} {chart.git.path}"
