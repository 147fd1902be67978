"""Run ``type: tofu``: fetch, select the backend, init, plan or apply, read the outputs.

The binary is ``tofu`` on the PATH, else ``terraform``. The backend is chosen
by an override file (``_tunnel_backend_override.tf``), which replaces any
backend the configuration declares: ``kubernetes`` (state in a Secret of the
backend namespace) or, when the spec asks for ``local``, a state file in the
run's directory that is discarded with it.

A module is code (``local-exec``, ``external``, providers), so tofu never
holds the agent's credentials: the backend's ``config_path``, ``KUBECONFIG``
and ``KUBE_CONFIG_PATH`` name a kubeconfig of the commands' gateway whose
token acts as the command's submitter, for this step only
(:mod:`.gateway`); the in-cluster variables are withheld. State kept in the
agent's own namespace (the default) is the one thing relayed as the agent
(:class:`~.gateway.TofuState`).

Variables go in the environment as ``TF_VAR_<name>`` (strings as they are,
anything else as JSON), never on the command line. ``output -json`` is read
without being logged; sensitive outputs are masked from then on.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path
from typing import Any

from tunnel_commands import KubernetesBackend, TofuSpec
from tunnel_pki.files import create_private_file

from ..identity import RunIdentity
from .errors import ExecutorError, ProcessError
from .gateway import TofuState
from .git import fetch_source
from .jobs import run_in_job
from .process import ProcessResult, find_binary, run_process
from .secrets import OutputValue
from .steps import Step, StepReport

__all__ = [
    "BACKEND_OVERRIDE",
    "IN_CLUSTER_VARIABLES",
    "backend_override",
    "run_tofu",
    "variable_environment",
]

#: What would lead client-go (a provider, the backend) to the pod's ServiceAccount token.
IN_CLUSTER_VARIABLES = frozenset({"KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"})

BACKEND_OVERRIDE = "_tunnel_backend_override.tf"
_MAX_OUTPUT_JSON = 4 << 20
_APPLIED = re.compile(r"Resources: (\d+) added, (\d+) changed, (\d+) destroyed")
_PLANNED = re.compile(r"Plan: (\d+) to add, (\d+) to change, (\d+) to destroy")


def _hcl_string(value: str) -> str:
    """A quoted HCL string: JSON escapes, and no template sequences."""
    return json.dumps(value).replace("${", "$${").replace("%{", "%%{")


def backend_override(spec: TofuSpec, *, namespace: str, kubeconfig: Path, workdir: Path) -> str:
    """The override file's text that selects the spec's backend (``kubeconfig``: the run's)."""
    backend = spec.backend
    if isinstance(backend, KubernetesBackend):
        settings = {
            "secret_suffix": _hcl_string(backend.secret_suffix),
            "namespace": _hcl_string(backend.namespace or namespace),
            "config_path": _hcl_string(str(kubeconfig)),
        }
        kind = "kubernetes"
    else:
        settings = {"path": _hcl_string(str(workdir / "terraform.tfstate"))}
        kind = "local"
    lines = [f"    {key} = {value}" for key, value in settings.items()]
    return 'terraform {\n  backend "' + kind + '" {\n' + "\n".join(lines) + "\n  }\n}\n"


#: Files OpenTofu reads after the others, each overriding what came before.
_OVERRIDE_FILE = re.compile(r"(.*_)?override\.(tf|tofu)(\.json)?")
#: A backend or cloud block (or its JSON key), wherever it stands.
_BACKEND_BLOCK = re.compile(r"\b(backend|cloud)\b")


def _write_backend_override(module: Path, text: str, what: str) -> None:
    """Write the agent's backend into ``module``, where nothing of the module's replaces it.

    An override file of the module's own that sorts after the agent's would
    replace its backend (and send the state, secret variables in it, where
    the module says): such a module is refused. The file is created afresh,
    never through a link the module put in its place.
    """
    for candidate in sorted(module.iterdir()):
        name = candidate.name
        if name == BACKEND_OVERRIDE or not _OVERRIDE_FILE.fullmatch(name):
            continue
        if candidate.is_file() and _BACKEND_BLOCK.search(candidate.read_text(errors="replace")):
            raise ExecutorError(
                f"{what}: {name} declares a backend or cloud block; the agent sets the "
                "backend itself (in the cluster), so a module may not override it"
            )
    target = module / BACKEND_OVERRIDE
    target.unlink(missing_ok=True)
    create_private_file(target, text.encode())  # O_EXCL | O_NOFOLLOW: never through a link


def variable_environment(variables: dict[str, Any]) -> dict[str, str]:
    """``TF_VAR_<name>`` for each resolved variable."""
    return {
        f"TF_VAR_{name}": value if isinstance(value, str) else json.dumps(value)
        for name, value in variables.items()
    }


def scoped_backend(spec: TofuSpec, namespace: str, identity: RunIdentity) -> TofuSpec:
    """``spec`` with its state, when kept in the agent's namespace, named for its submitter.

    The agent keeps that state as itself (tunnel_agent/executors/gateway.py, ``TofuState``),
    so a submitter must not reach another's by naming the same suffix: the Secret of a
    command acting as ``tunnel:alice`` is ``tfstate-default-u<hash of alice>-<suffix>``.
    A command acting as the agent keeps the suffix as written (the state it always had).
    """
    backend = spec.backend
    if (
        not isinstance(backend, KubernetesBackend)
        or (backend.namespace or namespace) != namespace
        or identity.user is None
    ):
        return spec
    owner = hashlib.sha256(identity.user.encode()).hexdigest()[:10]
    # A label value (tfstateSecretSuffix) holds 63 characters at most.
    suffix = f"u{owner}-{backend.secret_suffix}"[:63].rstrip("-.")
    return dataclasses.replace(spec, backend=dataclasses.replace(backend, secret_suffix=suffix))


async def run_tofu(spec: TofuSpec, step: Step) -> StepReport:
    context = step.context
    if context.gateway is None:
        raise ExecutorError(f"{step.path}: tofu runs only through the agent's gateway")
    spec = scoped_backend(spec, context.namespace, context.identity)
    variables = {
        key: await step.values.resolve(value, step.path_of("variables", key))
        for key, value in spec.variables.items()
    }
    if context.jobs is not None:
        # The module's code runs in a Job, away from the agent's credentials; the
        # variables travel resolved (as the submitter).
        return await run_in_job(context.jobs, dataclasses.replace(spec, variables=variables), step)
    binary = find_binary(["tofu", "terraform"], context.environment)
    module = await fetch_source(spec.source, step.workdir / "source", step, step.path_of("git"))
    state = None
    backend = spec.backend
    if isinstance(backend, KubernetesBackend) and (backend.namespace or context.namespace) == (
        context.namespace
    ):
        state = TofuState(context.namespace, backend.secret_suffix)
    async with context.gateway.kubeconfig(
        step.workdir,
        own_namespace=context.own_namespace,
        label=f"command {context.command_id}",
        identity=context.identity,
        expires=context.deadline,
        tofu_state=state,
    ) as kubeconfig:
        _write_backend_override(
            module,
            backend_override(
                spec, namespace=context.namespace, kubeconfig=kubeconfig, workdir=step.workdir
            ),
            step.path_of("git"),
        )
        environment = {
            **{
                key: value
                for key, value in context.environment.items()
                if key not in IN_CLUSTER_VARIABLES
            },
            **variable_environment(variables),
            "TF_IN_AUTOMATION": "1",
            "TF_INPUT": "0",
            "CHECKPOINT_DISABLE": "1",
            # The kubernetes provider's and client-go's ways to a kubeconfig: the run's.
            "KUBECONFIG": str(kubeconfig),
            "KUBE_CONFIG_PATH": str(kubeconfig),
        }
        return await _run(spec, step, binary, module, environment)


async def _run(
    spec: TofuSpec, step: Step, binary: str, module: Path, environment: dict[str, str]
) -> StepReport:
    context = step.context
    name = Path(binary).name
    counts: dict[str, int] = {}

    def on_line(line: str) -> None:
        if match := _APPLIED.search(line) or _PLANNED.search(line):
            counts.update(zip(("add", "change", "destroy"), map(int, match.groups()), strict=True))
        step.emit(line)

    async def run(*arguments: str, capture: bool = False) -> ProcessResult:
        return await run_process(
            [binary, *arguments],
            cwd=module,
            environment=environment,
            emit=on_line,
            kill_grace=context.kill_grace,
            capture_stdout=capture,
            stdout_limit=_MAX_OUTPUT_JSON,
        )

    def failed(what: str, result: ProcessResult) -> ProcessError:
        return ProcessError(
            f"{step.path}: {name} {what} failed (exit {result.returncode}): {result.last_error}",
            returncode=result.returncode,
        )

    result = await run("init", "-input=false", "-no-color")
    if result.returncode != 0:
        raise failed("init", result)
    summary: dict[str, Any] = {"binary": name, "mode": "plan" if spec.plan else "apply"}
    outputs: dict[str, OutputValue] = {}
    if spec.plan:
        result = await run("plan", "-input=false", "-no-color", "-detailed-exitcode")
        if result.returncode not in (0, 2):
            raise failed("plan", result)
        summary["changes"] = result.returncode == 2
    else:
        result = await run("apply", "-auto-approve", "-input=false", "-no-color")
        if result.returncode != 0:
            raise failed("apply", result)
        result = await run("output", "-json", "-no-color", capture=True)
        if result.returncode != 0:
            raise failed("output", result)
        outputs = _outputs(result.stdout, step)
    summary["resources"] = counts or None
    summary["outputs"] = sorted(outputs)
    return StepReport(summary, outputs)


def _outputs(data: bytes, step: Step) -> dict[str, OutputValue]:
    try:
        document = json.loads(data) if data.strip() else {}
    except ValueError as exc:
        raise ExecutorError(f"{step.path}: the output of output -json is not JSON") from exc
    if not isinstance(document, dict):
        raise ExecutorError(f"{step.path}: the output of output -json is not a mapping")
    outputs = {}
    for key, entry in document.items():
        if not isinstance(entry, dict) or "value" not in entry:
            continue
        output = OutputValue(entry["value"], bool(entry.get("sensitive")))
        if output.sensitive:
            _mask(step, output.value)
            step.context.masker.add(output.as_text())
        outputs[str(key)] = output
    return outputs


def _mask(step: Step, value: Any) -> None:
    """Mask each string inside a sensitive output (a map of credentials ...)."""
    if isinstance(value, str):
        step.context.masker.add(value)
    elif isinstance(value, dict):
        for item in value.values():
            _mask(step, item)
    elif isinstance(value, list):
        for item in value:
            _mask(step, item)
