"""``type: manifests``: Kubernetes objects applied server-side, optionally pruned and awaited.

::

    spec:
      objects: [...]          # or yaml: "multi-document YAML"
      namespace: default-ns   # for namespaced objects that name none
      prune: false            # delete what this apply set held before and no longer does
      wait: {timeout: 5m}     # or false; the default waits 5m
      applySet: NAME          # the default is the command's name (<command>-<step> in a flow)

Objects given as YAML are parsed here, so both sides see the same objects.
``kind: List`` documents are flattened into their items. Any field of an
object except its identity (apiVersion, kind, name, namespace) and labels may be a
``secretRef`` (see :mod:`tunnel_commands.values`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from .documents import load_documents
from .durations import format_duration
from .errors import CommandSpecError, join_path
from .fields import DNS_LABEL, NAME, Fields
from .values import Scope, Value, dump_value, parse_value

__all__ = [
    "DEFAULT_WAIT",
    "MAX_OBJECTS",
    "ManifestsSpec",
    "object_identity",
    "parse_manifests",
]

#: The most objects one manifests spec may apply.
MAX_OBJECTS = 1000
#: How long to wait for readiness when ``wait`` is not given.
DEFAULT_WAIT = 300
_MAX_WAIT = 24 * 3600
_API_VERSION = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?v[0-9]+[a-z0-9]*$")
_KIND = re.compile(r"^[A-Z][A-Za-z0-9]{0,62}$")
_OBJECT_NAME = re.compile(r"^[^/%\s][^/%]{0,252}$")


@dataclass(frozen=True, slots=True)
class ManifestsSpec:
    """Objects to apply; ``wait_timeout`` is None when readiness is not awaited."""

    TYPE: ClassVar[str] = "manifests"

    objects: tuple[dict[str, Value], ...]
    apply_set: str
    namespace: str | None = None
    prune: bool = False
    wait_timeout: int | None = DEFAULT_WAIT

    def to_dict(self) -> dict[str, Any]:
        result: dict[str, Any] = {
            "objects": [dump_value(obj) for obj in self.objects],
            "applySet": self.apply_set,
            "prune": self.prune,
            "wait": False
            if self.wait_timeout is None
            else {"timeout": format_duration(self.wait_timeout)},
        }
        if self.namespace is not None:
            result["namespace"] = self.namespace
        return result


def object_identity(obj: dict[str, Value]) -> tuple[str, str, str, str]:
    """``(apiVersion, kind, namespace or "", name)`` of a parsed object."""
    metadata = obj["metadata"]
    assert isinstance(metadata, dict)
    return (
        str(obj["apiVersion"]),
        str(obj["kind"]),
        str(metadata.get("namespace") or ""),
        str(metadata["name"]),
    )


def parse_manifests(fields: Fields, scope: Scope) -> ManifestsSpec:
    source = fields.one_of(("objects", "yaml"))
    if source == "objects":
        raw_objects = fields.items("objects", max_items=MAX_OBJECTS) or []
        base = fields.path_of("objects")
    else:
        text = fields.string("yaml", max_length=1 << 20)
        base = fields.path_of("yaml")
        raw_objects = load_documents(text, base)
    namespace = fields.optional_string("namespace", pattern=DNS_LABEL, rule="a namespace name")
    prune = fields.boolean("prune", False)
    wait_timeout = _wait(fields)
    apply_set = fields.optional_string(
        "applySet", pattern=NAME, rule="a name of lower-case letters, digits and '-'"
    ) or scope.default_name(fields.path_of("applySet"), "applySet")
    fields.finish()
    objects: list[dict[str, Value]] = []
    seen: dict[tuple[str, str, str, str], str] = {}
    for index, raw in enumerate(raw_objects):
        for item_path, item in _flatten(raw, join_path(base, index)):
            obj = _parse_object(item, item_path, scope)
            group = str(obj["apiVersion"]).rpartition("/")[0]
            _, kind, object_namespace, name = object_identity(obj)
            key = (group, kind, object_namespace or namespace or "", name)
            if key in seen:
                raise CommandSpecError(item_path, f"is the same object as {seen[key]}")
            seen[key] = item_path
            objects.append(obj)
    if len(objects) > MAX_OBJECTS:
        raise CommandSpecError(base, f"must hold at most {MAX_OBJECTS} objects")
    return ManifestsSpec(tuple(objects), apply_set, namespace, prune, wait_timeout)


def _wait(fields: Fields) -> int | None:
    raw = fields.take("wait")
    if Fields.missing(raw) or raw is True:
        return DEFAULT_WAIT
    if raw is False:
        return None
    wait = Fields(raw, fields.path_of("wait"))
    timeout = wait.duration("timeout", DEFAULT_WAIT, maximum=_MAX_WAIT)
    wait.finish()
    return timeout


def _flatten(raw: Any, path: str) -> list[tuple[str, Any]]:
    """A ``kind: List`` (``v1/List``, ``ConfigMapList`` ...) as its items, else the object."""
    if (
        isinstance(raw, dict)
        and isinstance(raw.get("kind"), str)
        and raw["kind"].endswith("List")
        and isinstance(raw.get("items"), list)
    ):
        return [
            (join_path(join_path(path, "items"), i), item) for i, item in enumerate(raw["items"])
        ]
    return [(path, raw)]


def _parse_object(raw: Any, path: str, scope: Scope) -> dict[str, Value]:
    if not isinstance(raw, dict):
        raise CommandSpecError(path, "must be a Kubernetes object (a mapping)")
    fields = Fields(raw, path)
    fields.string("apiVersion", pattern=_API_VERSION, rule="an apiVersion such as v1 or apps/v1")
    fields.string("kind", pattern=_KIND, rule="a kind such as ConfigMap")
    metadata = fields.mapping("metadata", required=True)
    assert metadata is not None
    metadata.string("name", pattern=_OBJECT_NAME, rule="an object name")
    metadata.optional_string("namespace", pattern=DNS_LABEL, rule="a namespace name")
    labels = metadata.mapping("labels")
    if labels is not None:  # the apply set adds its own: they must stay plain strings
        for key, value in labels.raw.items():
            if not isinstance(value, str):
                raise CommandSpecError(labels.path_of(key), "must be a string")
    parsed = parse_value(raw, path, scope)
    assert isinstance(parsed, dict)
    return parsed
