"""The command-spec subtree of the project's error hierarchy::

    TunnelError                  (protocol.errors)
    └── CommandSpecError         a command spec that is not valid; names the field
                                 (also ValueError)

The message starts with the field path (``spec.steps[2].chart: required``), so
a person can find the field; it never quotes a value that could be a secret.
"""

from __future__ import annotations

from protocol.errors import TunnelError

__all__ = ["CommandSpecError", "join_path"]


class CommandSpecError(TunnelError, ValueError):
    """A command spec that is not valid: ``path`` names the field, ``problem`` says why."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path or "command"
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


def join_path(path: str, name: str | int) -> str:
    """The path of a field (``spec.chart``) or a list item (``spec.steps[2]``) under ``path``."""
    if isinstance(name, int):
        return f"{path}[{name}]"
    return f"{path}.{name}" if path else name
