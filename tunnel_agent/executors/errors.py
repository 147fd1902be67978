"""Errors of the executors, a subtree of the agent's::

    TunnelError                    (protocol.errors)
    └── AgentError                 (tunnel_agent.errors)
        └── ExecutorError          a command could not be carried out: a failed result
            ├── KubeRequestError   the API server refused a request or could not be reached
            └── ProcessError       helm, tofu or git failed (or is missing)

:func:`~tunnel_agent.executors.execute` turns every one of them into a failed
:class:`~tunnel_agent.executors.context.ExecutionResult`; none reaches the
agent's command loop. Messages name the spec field or step at fault, and
pass through the run's masker before they leave the cluster.
"""

from __future__ import annotations

from tunnel_agent.errors import AgentError

__all__ = ["ExecutorError", "KubeRequestError", "ProcessError", "own_namespace_error"]


class ExecutorError(AgentError):
    """A command could not be carried out; the message says where and why."""


class KubeRequestError(ExecutorError):
    """A Kubernetes API request failed; ``status`` is its HTTP status (0: unreachable).

    ``detail`` is the message without the request (``HTTP 422: ...``), for
    callers that name the object themselves.
    """

    def __init__(
        self, message: str, *, status: int = 0, reason: str = "", detail: str = ""
    ) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.detail = detail or message


class ProcessError(ExecutorError):
    """A helm, tofu or git process failed, or its binary is not on the PATH."""

    def __init__(self, message: str, *, returncode: int | None = None) -> None:
        super().__init__(message)
        self.returncode = returncode


def own_namespace_error(namespace: str, path: str) -> ExecutorError:
    """The refusal, naming ``path``, of what is in the agent's own namespace."""
    return ExecutorError(
        f"{path}: namespace {namespace} is the agent's own (its credentials, command journal "
        "and bootstrap token are there); commands may not read or write in it"
    )
