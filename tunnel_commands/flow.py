"""``type: flow``: steps of the other types, run in order.

::

    spec:
      steps:
        - name: infra
          type: tofu
          git: {url: https://git.example.com/infra.git, ref: main}
        - name: app
          type: helm
          continueOnError: false       # the default: a failed step stops the flow
          namespace: web
          chart: {oci: oci://registry.example.com/charts/web}
          values:
            database: {host: {outputRef: {step: infra, output: db_host}}}

A step holds its type's fields beside ``name``, ``type`` and
``continueOnError``. ``outputRef`` may name only an earlier step with outputs.
The names a step derives (release, apply set, state suffix) default to
``<command>-<step>``. A flow does not nest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from .errors import CommandSpecError, join_path
from .fields import NAME, Fields, describe
from .helm import HelmSpec, parse_helm
from .manifests import ManifestsSpec, parse_manifests
from .query import QuerySpec, parse_query
from .tofu import TofuSpec, parse_tofu
from .values import Scope

__all__ = ["MAX_STEPS", "STEP_PARSERS", "FlowSpec", "FlowStep", "StepSpec", "parse_flow"]

MAX_STEPS = 50

StepSpec = ManifestsSpec | HelmSpec | TofuSpec | QuerySpec

#: How each type's spec is read, by type name (every type but ``flow``).
STEP_PARSERS: dict[str, Callable[[Fields, Scope], StepSpec]] = {
    "manifests": parse_manifests,
    "helm": parse_helm,
    "tofu": parse_tofu,
    "query": parse_query,
}
_STEP_FIELDS = ("name", "type", "continueOnError")


@dataclass(frozen=True, slots=True)
class FlowStep:
    """One step: its name, what it does, and whether the flow goes on if it fails."""

    name: str
    spec: StepSpec
    continue_on_error: bool = False

    @property
    def type(self) -> str:
        return self.spec.TYPE

    def to_dict(self) -> dict[str, Any]:
        head = {"name": self.name, "type": self.type, "continueOnError": self.continue_on_error}
        return head | self.spec.to_dict()


@dataclass(frozen=True, slots=True)
class FlowSpec:
    """Steps run in order; a failure stops the flow unless the step continues on error."""

    TYPE: ClassVar[str] = "flow"

    steps: tuple[FlowStep, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"steps": [step.to_dict() for step in self.steps]}


def parse_flow(fields: Fields, scope: Scope) -> FlowSpec:
    raw_steps = fields.items("steps", required=True, max_items=MAX_STEPS) or []
    if not raw_steps:
        raise CommandSpecError(fields.path_of("steps"), "must have at least one step")
    fields.finish()
    earlier: dict[str, str] = {}
    steps: list[FlowStep] = []
    for index, raw in enumerate(raw_steps):
        path = join_path(fields.path_of("steps"), index)
        head = Fields(raw, path)
        name = head.string(
            "name", pattern=NAME, rule="a step name of lower-case letters, digits and '-'"
        )
        if name in earlier:
            raise CommandSpecError(head.path_of("name"), f"{describe(name)} names an earlier step")
        step_type = head.string("type", max_length=64)
        parser = STEP_PARSERS.get(step_type)
        if parser is None:
            allowed = ", ".join(STEP_PARSERS)
            raise CommandSpecError(
                head.path_of("type"), f"{describe(step_type)} is not a step type ({allowed})"
            )
        continue_on_error = head.boolean("continueOnError", False)
        body = Fields({k: v for k, v in head.raw.items() if k not in _STEP_FIELDS}, path)
        step_scope = Scope(f"{scope.name}-{name}", dict(earlier))
        steps.append(FlowStep(name, parser(body, step_scope), continue_on_error))
        earlier[name] = step_type
    return FlowSpec(tuple(steps))
