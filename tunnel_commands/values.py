"""Values that may hold references resolved in the cluster: ``secretRef`` and ``outputRef``.

Wherever a spec takes free-form values (an object's fields, Helm values, OpenTofu
variables), a mapping may stand for a value to be fetched by the agent:

- ``{secretRef: {namespace, name, key}}``: one key of a Kubernetes Secret,
  as text;
- ``{outputRef: {step, output}}``: an output of an earlier step of the same
  flow (only in a flow, and only of a step that has outputs: ``tofu``).

A one-key mapping ``{secretRef: {...}}`` is a reference when the inner mapping
has ``key`` or ``namespace``; without them it is Kubernetes' own field (an
``envFrom`` item's ``secretRef: {name}``) and stays as written. The values a
reference stands for never leave the cluster.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias, Union

from .errors import CommandSpecError, join_path
from .fields import DNS_LABEL, DNS_SUBDOMAIN, NAME, Fields, describe

__all__ = [
    "OUTPUT_TYPES",
    "OutputRef",
    "Scope",
    "SecretRef",
    "Value",
    "dump_value",
    "parse_secret_ref",
    "parse_value",
    "references",
]

#: The step types whose outputs later steps may use.
OUTPUT_TYPES = frozenset({"tofu"})
#: An output name (an OpenTofu identifier).
OUTPUT_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,127}$")
#: A key of a Secret's data.
SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")


@dataclass(frozen=True, slots=True)
class SecretRef:
    """One key of a Kubernetes Secret, read by the agent when the command runs."""

    namespace: str
    name: str
    key: str

    def to_dict(self) -> dict[str, Any]:
        return {"secretRef": {"namespace": self.namespace, "name": self.name, "key": self.key}}


@dataclass(frozen=True, slots=True)
class OutputRef:
    """An output of an earlier step of the same flow."""

    step: str
    output: str

    def to_dict(self) -> dict[str, Any]:
        return {"outputRef": {"step": self.step, "output": self.output}}


Value: TypeAlias = Union[  # noqa: UP007 (a recursive alias needs the string form)
    bool, int, float, str, list["Value"], dict[str, "Value"], SecretRef, OutputRef, None
]
"""A JSON value in which references may stand for values. Treat it as read-only."""


@dataclass(frozen=True, slots=True)
class Scope:
    """Where a spec is read: a whole command, or one step of a flow.

    ``name`` is the default for the names a spec derives (Helm release, apply
    set, OpenTofu state suffix): the command's name, or ``<command>-<step>``
    in a flow. ``steps`` maps each earlier step of the flow to its type; it
    is None outside a flow, where ``outputRef`` is not allowed.
    """

    name: str
    steps: Mapping[str, str] | None = None

    def default_name(self, path: str, field: str) -> str:
        """``name`` as the default of ``field``, refused when it is too long for one."""
        if not NAME.fullmatch(self.name):
            raise CommandSpecError(
                path,
                f"the default {field} {describe(self.name)} is longer than 53 characters; "
                f"set {field}",
            )
        return self.name


def parse_secret_ref(raw: object, path: str) -> SecretRef:
    """The inside of ``{secretRef: ...}`` at ``path``."""
    fields = Fields(raw, path)
    namespace = fields.string("namespace", pattern=DNS_LABEL, rule="a namespace name")
    name = fields.string("name", pattern=DNS_SUBDOMAIN, rule="a Secret name")
    key = fields.string("key", pattern=SECRET_KEY, rule="a Secret key")
    fields.finish()
    return SecretRef(namespace, name, key)


def _parse_output_ref(raw: object, path: str, scope: Scope) -> OutputRef:
    if scope.steps is None:
        raise CommandSpecError(path, "outputRef is only allowed in the steps of a flow")
    fields = Fields(raw, path)
    step = fields.string("step", pattern=NAME, rule="a step name")
    output = fields.string("output", pattern=OUTPUT_NAME, rule="an output name")
    fields.finish()
    step_type = scope.steps.get(step)
    if step_type is None:
        raise CommandSpecError(join_path(path, "step"), f"names no earlier step: {step!r}")
    if step_type not in OUTPUT_TYPES:
        raise CommandSpecError(
            join_path(path, "step"), f"step {step!r} is a {step_type} step, which has no outputs"
        )
    return OutputRef(step, output)


def _is_secret_ref(value: dict[str, Any]) -> bool:
    if len(value) != 1 or "secretRef" not in value:
        return False
    inner = value["secretRef"]
    return not isinstance(inner, dict) or "key" in inner or "namespace" in inner


def parse_value(raw: object, path: str, scope: Scope) -> Value:
    """``raw`` (already bounded by ``check_structure``) with its references parsed."""
    if isinstance(raw, dict):
        if _is_secret_ref(raw):
            inner_path = join_path(path, "secretRef")
            if not isinstance(raw["secretRef"], dict):
                raise CommandSpecError(inner_path, "must be a mapping of namespace, name and key")
            return parse_secret_ref(raw["secretRef"], inner_path)
        if len(raw) == 1 and "outputRef" in raw:
            return _parse_output_ref(raw["outputRef"], join_path(path, "outputRef"), scope)
        return {key: parse_value(item, join_path(path, key), scope) for key, item in raw.items()}
    if isinstance(raw, list):
        return [parse_value(item, join_path(path, index), scope) for index, item in enumerate(raw)]
    if raw is None or isinstance(raw, bool | int | float | str):
        return raw
    raise CommandSpecError(path, "must be a string, number, boolean, list or mapping")


def dump_value(value: Value) -> Any:
    """``value`` as plain JSON, references written back as their mappings."""
    if isinstance(value, SecretRef | OutputRef):
        return value.to_dict()
    if isinstance(value, dict):
        return {key: dump_value(item) for key, item in value.items()}
    if isinstance(value, list):
        return [dump_value(item) for item in value]
    return value


def references(value: Value) -> Iterator[SecretRef | OutputRef]:
    """Every reference in ``value``."""
    if isinstance(value, SecretRef | OutputRef):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from references(item)
    elif isinstance(value, list):
        for item in value:
            yield from references(item)
