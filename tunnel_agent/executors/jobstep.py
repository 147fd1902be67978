"""Inside a run's Job pod: one helm or tofu step, from the document the agent mounted.

``tunnel-agent step FILE`` reads the step document (:func:`step_document`
writes it): the step as a one-step command, its references already resolved
by the agent (as the submitter), the values to mask, and the run's kubeconfig
(the agent's gateway, a token acting as the submitter until the run's
deadline). It runs the step with the same executors as the agent would, here,
where no agent credential is: the pod mounts no ServiceAccount token. Log
lines go to standard output (the pod's log, which the agent follows); the
last line is the result, marked with :data:`RESULT_MARK`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from tunnel_commands import parse_command

from ..identity import AGENT
from ..kubeapi import KubeApi, load_kube_configuration
from .context import ExecutionContext
from .errors import ExecutorError
from .flow import run_spec
from .gateway import CommandsGateway
from .jobspec import RESULT_MARK
from .kube import KubeClient
from .secrets import OutputValue, SecretResolver, ValueResolver
from .steps import Step

__all__ = ["GivenKubeconfig", "main", "run_step_file"]


class GivenKubeconfig(CommandsGateway):
    """The gateway as the pod sees it: one kubeconfig, minted by the agent for this run."""

    def __init__(self, kube: KubeApi, text: str) -> None:
        super().__init__(kube)
        self._text = text

    @contextlib.asynccontextmanager
    async def kubeconfig(self, directory: Path, **_: Any) -> AsyncIterator[Path]:
        path = directory / "kubeconfig.json"
        path.write_text(self._text)
        path.chmod(0o600)
        try:
            yield path
        finally:
            path.unlink(missing_ok=True)


def _prepare(document: Path, workdir: Path) -> tuple[dict[str, Any], Path, Path]:
    """The document, the run's kubeconfig written out, and the home directory."""
    loaded = json.loads(document.read_bytes())
    workdir.mkdir(parents=True, exist_ok=True)
    kubeconfig = workdir / "run-kubeconfig.json"
    kubeconfig.write_text(str(loaded["kubeconfig"]))
    kubeconfig.chmod(0o600)
    home = workdir / "home"
    home.mkdir(exist_ok=True)
    return loaded, kubeconfig, home


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def run_step_file(document: Path, workdir: Path) -> int:
    """Run the step ``document`` describes in ``workdir``; write its log and result."""
    loaded, kubeconfig, home = await asyncio.to_thread(_prepare, document, workdir)
    kube = KubeApi(await load_kube_configuration(kubeconfig))
    command = parse_command(loaded["command"])
    context = ExecutionContext(
        command_id="job",
        attempt=1,
        kube=kube,
        workdir=workdir,
        log=_say,
        namespace=str(loaded["namespace"]),
        # The pod's own environment (the image's and the Job's): nothing of the agent's.
        environment=dict(os.environ) | {"HOME": str(home)},
        own_namespace=loaded.get("ownNamespace"),
        allow_file_git_sources=bool(loaded.get("allowFileGitSources")),
        gateway=GivenKubeconfig(kube, str(loaded["kubeconfig"])),
        # The token of the kubeconfig acts as the submitter: nothing to add here.
        identity=AGENT,
    )
    for value in loaded.get("masked") or []:
        context.masker.add(str(value))
    client = KubeClient(kube)
    step = Step(
        context,
        client,
        ValueResolver(SecretResolver(client, context.masker), context.masker),
        str(loaded.get("path") or "spec"),
        workdir,
    )
    result: dict[str, Any]
    try:
        report = await run_spec(command.spec, step)
    except ExecutorError as exc:
        result = {"error": context.masker.mask(str(exc))}
    else:
        result = {
            "summary": report.summary,
            "outputs": {name: _output(value) for name, value in report.outputs.items()},
            "error": report.error,
        }
    finally:
        await kube.close()
    _say(RESULT_MARK + json.dumps(result))
    return 0


def _output(value: OutputValue) -> dict[str, Any]:
    return {"value": value.value, "sensitive": value.sensitive}


def main(argv: list[str]) -> int:
    """``tunnel-agent step FILE``: the entry point of a run's Job pod."""
    if len(argv) != 1:
        sys.stderr.write("usage: tunnel-agent step FILE\n")
        return 2
    workdir = Path(os.environ.get("TUNNEL_STEP_WORKDIR", "/work"))
    return asyncio.run(run_step_file(Path(argv[0]), workdir / "step"))
