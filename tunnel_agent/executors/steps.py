"""What each type's executor is handed (:class:`Step`) and hands back (:class:`StepReport`).

A whole command of one type is one step at ``spec``; a flow's steps are at
``spec.steps[i]``. An executor raises :class:`~.errors.ExecutorError` to fail
(the message names the field); anything else it reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunnel_commands.errors import join_path

from .context import ExecutionContext
from .kube import KubeClient
from .secrets import OutputValue, ValueResolver

__all__ = ["Step", "StepReport"]


@dataclass
class Step:
    """One step of a run: its context, API access, value resolver and spec path."""

    context: ExecutionContext
    client: KubeClient
    values: ValueResolver
    path: str
    workdir: Path
    #: Every output of the run so far, by the name it is stored under.
    collected: dict[str, OutputValue] = field(default_factory=dict)

    def path_of(self, *names: str | int) -> str:
        """The spec path of a field of this step (``spec.steps[1].chart``)."""
        path = self.path
        for name in names:
            path = join_path(path, name)
        return path

    def emit(self, line: str) -> None:
        self.context.emit(line)


@dataclass
class StepReport:
    """What a step did (JSON, no secret values) and the outputs it produced.

    ``error`` set means the step failed but has a summary to show (a flow
    whose step failed).
    """

    summary: dict[str, Any]
    outputs: dict[str, OutputValue] = field(default_factory=dict)
    error: str | None = None
