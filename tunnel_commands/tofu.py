"""``type: tofu``: an OpenTofu (or Terraform) configuration from git, planned or applied.

::

    spec:
      git: {url: https://git.example.com/infra.git, ref: v1.4.0, path: envs/prod}
      plan: false                # true: plan only, change nothing
      variables:                 # passed as TF_VAR_<name>, never on the command line
        region: eu-west-1
        db_password: {secretRef: {namespace: infra, name: db, key: password}}
      backend: {namespace: infra, secretSuffix: web-app}
          # state in a Secret through the "kubernetes" backend; namespace defaults
          # to the agent's own, secretSuffix to the command's name
          # (<command>-<step> in a flow). Or:
      # backend: {local: true}   # state in the run's private directory, discarded
      #                          # afterwards: for tests and throwaway plans only

Variable values that are not strings are passed as JSON, which OpenTofu reads
as HCL (lists, maps, numbers, booleans). After an apply, ``tofu output -json``
is read; the outputs go to the command's ``outputsSecret`` and, in a flow, to
later steps' ``outputRef``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .errors import CommandSpecError
from .fields import DNS_LABEL, NAME, Fields
from .sources import GitSource, parse_git_source
from .values import Scope, Value, dump_value, parse_value

__all__ = [
    "MAX_VARIABLES",
    "KubernetesBackend",
    "LocalBackend",
    "TofuBackend",
    "TofuSpec",
    "parse_tofu",
]

MAX_VARIABLES = 500
_VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,127}$")


@dataclass(frozen=True, slots=True)
class KubernetesBackend:
    """State in a Secret ``tfstate-default-<secret_suffix>``; ``namespace`` None: the agent's."""

    secret_suffix: str
    namespace: str | None = None

    def to_dict(self) -> dict[str, Any]:
        result: dict[str, Any] = {"secretSuffix": self.secret_suffix}
        return result | ({"namespace": self.namespace} if self.namespace else {})


@dataclass(frozen=True, slots=True)
class LocalBackend:
    """State in the run's private directory, discarded afterwards."""

    def to_dict(self) -> dict[str, Any]:
        return {"local": True}


TofuBackend = KubernetesBackend | LocalBackend


@dataclass(frozen=True, slots=True)
class TofuSpec:
    """An OpenTofu configuration to plan or apply."""

    TYPE: ClassVar[str] = "tofu"

    source: GitSource
    backend: TofuBackend
    plan: bool = False
    variables: dict[str, Value] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "git": self.source.to_dict(),
            "plan": self.plan,
            "variables": {name: dump_value(value) for name, value in self.variables.items()},
            "backend": self.backend.to_dict(),
        }


def parse_tofu(fields: Fields, scope: Scope) -> TofuSpec:
    source = parse_git_source(fields.take("git", required=True), fields.path_of("git"))
    plan = fields.boolean("plan", False)
    variables: dict[str, Value] = {}
    table = fields.mapping("variables")
    if table is not None:
        if len(table.raw) > MAX_VARIABLES:
            raise CommandSpecError(table.path, f"must have at most {MAX_VARIABLES} variables")
        for name, raw in table.raw.items():
            path = table.path_of(name[:40])
            if not _VARIABLE.fullmatch(name):
                raise CommandSpecError(path, "is not a variable name (letters, digits, _ and -)")
            variables[name] = parse_value(raw, path, scope)
            table.take(name)
    backend = _parse_backend(fields, scope)
    fields.finish()
    return TofuSpec(source, backend, plan, variables)


def _parse_backend(fields: Fields, scope: Scope) -> TofuBackend:
    backend = fields.mapping("backend")
    if backend is None:
        return KubernetesBackend(scope.default_name(fields.path_of("backend"), "secretSuffix"))
    if backend.has("local"):
        if backend.take("local") is not True:
            raise CommandSpecError(
                backend.path_of("local"), "must be true; leave it out for the kubernetes backend"
            )
        backend.finish()
        return LocalBackend()
    namespace = backend.optional_string("namespace", pattern=DNS_LABEL, rule="a namespace name")
    suffix = backend.optional_string(
        "secretSuffix", pattern=NAME, rule="a name of lower-case letters, digits and '-'"
    ) or scope.default_name(backend.path_of("secretSuffix"), "secretSuffix")
    backend.finish()
    return KubernetesBackend(suffix, namespace)
