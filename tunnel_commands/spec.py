"""A command: the versioned envelope and :func:`parse_command`, the one way to read one.

::

    apiVersion: tunnel/v1
    type: manifests | helm | tofu | flow | query
    name: web-app            # [a-z0-9-], at most 53: apply set, release, state suffix
    timeout: 10m             # the whole command; default 15m, at most 24h
    retry: {maxAttempts: 1}  # deliveries if the agent is lost (1..10); default 1
    outputsSecret: {namespace: ns, name: web-app-outputs}   # optional
    spec: {...}              # per type: see the type's module

The server reads a submission with :func:`parse_command` (a bad one is a 400
naming the field); the agent reads what it receives with the same function,
so both sides accept exactly the same commands. ``Command.to_dict()`` gives
the canonical form (defaults filled in, YAML objects parsed), which
:func:`parse_command` reads back to an equal ``Command``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from .documents import check_structure, load_document
from .durations import format_duration
from .errors import CommandSpecError
from .fields import DNS_LABEL, DNS_SUBDOMAIN, NAME, Fields, describe
from .flow import STEP_PARSERS, FlowSpec, parse_flow
from .helm import HelmSpec
from .manifests import ManifestsSpec
from .query import QuerySpec
from .tofu import TofuSpec
from .values import Scope

__all__ = [
    "ALL_COMMAND_TYPES",
    "API_VERSION",
    "COMMAND_TYPES",
    "DEFAULT_TIMEOUT",
    "MAX_ATTEMPTS",
    "MAX_TIMEOUT",
    "Command",
    "CommandSpec",
    "OutputsSecret",
    "parse_command",
]

API_VERSION = "tunnel/v1"
DEFAULT_TIMEOUT = 15 * 60
MAX_TIMEOUT = 24 * 3600
MAX_ATTEMPTS = 10

CommandSpec = ManifestsSpec | HelmSpec | TofuSpec | FlowSpec | QuerySpec

_PARSERS: dict[str, Callable[[Fields, Scope], CommandSpec]] = {
    **STEP_PARSERS,
    "flow": parse_flow,
}
#: The command types, in the order the documentation lists them.
COMMAND_TYPES = ("manifests", "helm", "tofu", "flow", "query")
#: The same, as a set: what an agent runs unless told otherwise (--command-types).
ALL_COMMAND_TYPES = frozenset(COMMAND_TYPES)


@dataclass(frozen=True, slots=True)
class OutputsSecret:
    """The Secret a command's outputs are written to."""

    namespace: str
    name: str

    def to_dict(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "name": self.name}


@dataclass(frozen=True, slots=True)
class Command:
    """A validated command; ``spec`` is typed per command type."""

    API_VERSION: ClassVar[str] = API_VERSION

    name: str
    spec: CommandSpec
    timeout: int = DEFAULT_TIMEOUT
    max_attempts: int = 1
    outputs_secret: OutputsSecret | None = None

    @property
    def type(self) -> str:
        return self.spec.TYPE

    def to_dict(self) -> dict[str, Any]:
        """The canonical JSON form, which :func:`parse_command` reads back unchanged."""
        result: dict[str, Any] = {
            "apiVersion": API_VERSION,
            "type": self.type,
            "name": self.name,
            "timeout": format_duration(self.timeout),
            "retry": {"maxAttempts": self.max_attempts},
        }
        if self.outputs_secret is not None:
            result["outputsSecret"] = self.outputs_secret.to_dict()
        result["spec"] = self.spec.to_dict()
        return result


def parse_command(source: str | bytes | Mapping[str, Any]) -> Command:
    """Read and validate a command from YAML or JSON text, or from a parsed mapping.

    Raises :class:`~tunnel_commands.errors.CommandSpecError` naming the first
    field that is wrong.
    """
    if isinstance(source, str | bytes):
        document = load_document(source)
    else:
        document = dict(source) if isinstance(source, Mapping) else source
        check_structure(document)
    fields = Fields(document, "")
    api_version = fields.string("apiVersion", max_length=64)
    if api_version != API_VERSION:
        raise CommandSpecError(
            "apiVersion", f"{describe(api_version)} is not supported; use {API_VERSION}"
        )
    command_type = fields.string("type", max_length=64)
    parser = _PARSERS.get(command_type)
    if parser is None:
        raise CommandSpecError(
            "type", f"{describe(command_type)} is not a command type ({', '.join(COMMAND_TYPES)})"
        )
    name = fields.string(
        "name", pattern=NAME, rule="a name of lower-case letters, digits and '-' (at most 53)"
    )
    timeout = fields.duration("timeout", DEFAULT_TIMEOUT, maximum=MAX_TIMEOUT)
    assert timeout is not None
    max_attempts = 1
    retry = fields.mapping("retry")
    if retry is not None:
        max_attempts = retry.integer("maxAttempts", 1, minimum=1, maximum=MAX_ATTEMPTS) or 1
        retry.finish()
    outputs_secret = None
    target = fields.mapping("outputsSecret")
    if target is not None:
        outputs_secret = OutputsSecret(
            target.string("namespace", pattern=DNS_LABEL, rule="a namespace name"),
            target.string("name", pattern=DNS_SUBDOMAIN, rule="a Secret name"),
        )
        target.finish()
    spec_fields = fields.mapping("spec", required=True)
    assert spec_fields is not None
    spec = parser(spec_fields, Scope(name))
    fields.finish()
    return Command(name, spec, timeout, max_attempts, outputs_secret)
