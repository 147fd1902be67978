"""What a command run is given (:class:`ExecutionContext`) and what it gives back."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..identity import AGENT, RunIdentity
from ..kubeapi import KubeApi
from .errors import own_namespace_error
from .gateway import CommandsGateway
from .jobspec import JobSettings
from .masking import Masker

__all__ = [
    "MAX_LINE",
    "MAX_SUMMARY_BYTES",
    "PASSED_ENVIRONMENT",
    "ExecutionContext",
    "ExecutionResult",
    "subprocess_environment",
    "summary_size",
]

#: The longest log line sent; longer ones are cut and marked.
MAX_LINE = 4096
#: The largest summary, as JSON.
MAX_SUMMARY_BYTES = 1 << 20

#: The agent's environment variables that helm, tofu and git see. Nothing
#: else passes: the agent's own settings (a bootstrap token ...) stay out, and
#: so do KUBERNETES_SERVICE_HOST/PORT, which would lead client-go to the pod's
#: ServiceAccount token: a run reaches the API server through the gateway only.
PASSED_ENVIRONMENT = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LANG",
        "LC_ALL",
        "TZ",
        "TMPDIR",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "http_proxy",
        "https_proxy",
        "no_proxy",
        "SSH_AUTH_SOCK",
        "GIT_SSH_COMMAND",
    }
)


def subprocess_environment() -> dict[str, str]:
    """The part of the agent's environment in :data:`PASSED_ENVIRONMENT`."""
    return {name: value for name, value in os.environ.items() if name in PASSED_ENVIRONMENT}


@dataclass
class ExecutionContext:
    """One run (one attempt) of one command on the agent.

    ``log`` receives each line as it is produced; executors call
    :meth:`emit`, which masks secret values and caps the line first.
    ``workdir`` is private to the run; the caller creates and removes it.
    ``namespace`` is the agent's own: apply-set records and, by default,
    OpenTofu state live there. ``environment`` is the base environment of
    helm, tofu and git (its PATH is where they are looked up).
    """

    command_id: str
    attempt: int
    kube: KubeApi
    workdir: Path
    log: Callable[[str], None]
    kubeconfig: Path | None = None
    namespace: str = "default"
    environment: dict[str, str] = field(default_factory=subprocess_environment)
    masker: Masker = field(default_factory=Masker)
    #: The agent's own namespace in its cluster (None outside one): its
    #: credentials, command journal and bootstrap token are there, and no
    #: command reads or writes in it (:meth:`check_not_own`).
    own_namespace: str | None = None
    #: Whether git sources may be ``file://`` paths in the agent's pod
    #: (``--allow-file-git-sources``; :func:`.git.file_source_refusal`).
    allow_file_git_sources: bool = False
    #: Where helm and tofu reach the API server, with a credential of this run
    #: (None: they cannot run).
    gateway: CommandsGateway | None = None
    #: Whom every API call of the run acts as (from the server's offer).
    identity: RunIdentity = AGENT
    #: The loop's clock when the run's time is up: its credentials stop working then.
    deadline: float | None = None
    #: In a cluster: helm and tofu steps run as Jobs, never in the agent's pod (None: here).
    jobs: JobSettings | None = None
    #: Seconds between SIGTERM and SIGKILL when a process is stopped.
    kill_grace: float = 5.0
    #: Seconds between readiness checks while waiting for objects.
    poll_interval: float = 2.0

    def check_not_own(self, namespace: str | None, path: str) -> None:
        """Refuse, naming ``path``, what is in the agent's own namespace.

        With its key, a command could connect as this cluster's agent; with it
        overwritten, the agent could not connect at all; with a token minted
        there for its ServiceAccount, a command could impersonate anyone.
        """
        if self.own_namespace is not None and namespace == self.own_namespace:
            raise own_namespace_error(namespace, path)

    def emit(self, line: str) -> None:
        """Send one log line, secret values masked, at most :data:`MAX_LINE` characters."""
        text = self.masker.mask(line.rstrip("\r\n"))
        if len(text) > MAX_LINE:
            text = text[: MAX_LINE - 15] + " ...[truncated]"
        self.log(text)


@dataclass(frozen=True, slots=True)
class ExecutionResult:
    """How a run ended.

    ``summary`` is JSON, at most :data:`MAX_SUMMARY_BYTES`, free of secret
    values; ``outputs`` lists the names of the outputs written to the
    command's outputs Secret (never their values); ``error`` says what went
    wrong when ``outcome`` is ``"failed"``.
    """

    outcome: Literal["succeeded", "failed"]
    summary: dict[str, Any] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def succeeded(self) -> bool:
        return self.outcome == "succeeded"

    def to_dict(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "summary": self.summary,
            "outputs": list(self.outputs),
            "error": self.error,
        }


def summary_size(summary: dict[str, Any]) -> int:
    """The size of ``summary`` as compact JSON."""
    return len(json.dumps(summary, separators=(",", ":"), default=str))
