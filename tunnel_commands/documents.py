"""Reading a spec's text (YAML or JSON) and bounding any structure before it is used.

A spec is at most :data:`MAX_SPEC_BYTES` of text. Its structure is walked
once, iteratively, before anything else reads it: depth, list lengths,
mapping sizes and the number of nodes are bounded, mapping keys must be
strings, and scalars must be what JSON can carry (so YAML timestamps stay
strings and ``.nan`` is refused). The walk counts nodes reached through YAML
aliases again each time, so an alias "bomb" stops at the node limit instead
of expanding.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import yaml

from .errors import CommandSpecError, join_path

__all__ = [
    "MAX_DEPTH",
    "MAX_ITEMS",
    "MAX_NODES",
    "MAX_SPEC_BYTES",
    "check_structure",
    "load_document",
    "load_documents",
]

#: The largest spec, as text, and (with a small allowance for the defaults
#: ``Command.to_dict`` fills in) as the size of its strings and nodes.
MAX_SPEC_BYTES = 1 << 20
_STRUCTURE_ALLOWANCE = 64 << 10
#: The deepest nesting of mappings and lists.
MAX_DEPTH = 64
#: The most items in one list or entries in one mapping.
MAX_ITEMS = 10_000
#: The most nodes (mappings, lists, scalars) in one spec.
MAX_NODES = 200_000

_TIMESTAMP = "tag:yaml.org,2002:timestamp"


class _Loader(yaml.SafeLoader):
    """The safe loader, but timestamps stay strings, as Kubernetes and JSON keep them."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def load_document(text: str | bytes, path: str = "") -> Any:
    """The one document in ``text`` (JSON or YAML), bounded by :func:`check_structure`."""
    text = _text(text, path)
    if text.lstrip().startswith("{"):
        try:
            document = json.loads(text, parse_constant=_refuse_constant)
        except ValueError as exc:
            raise CommandSpecError(path, f"not valid JSON: {_json_problem(exc)}") from exc
    else:
        documents = list(_yaml_documents(text, path))
        if len(documents) != 1:
            raise CommandSpecError(path, f"must hold one YAML document, not {len(documents)}")
        document = documents[0]
    check_structure(document, path)
    return document


def load_documents(text: str | bytes, path: str) -> list[Any]:
    """Every non-empty document of multi-document YAML ``text``, bounded together."""
    documents = [doc for doc in _yaml_documents(_text(text, path), path) if doc is not None]
    check_structure(documents, path)
    return documents


def _text(text: str | bytes, path: str) -> str:
    size = len(text) if isinstance(text, bytes) else len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_SPEC_BYTES:
        raise CommandSpecError(path, f"is {size} bytes; a spec is at most {MAX_SPEC_BYTES} bytes")
    if isinstance(text, bytes):
        try:
            return text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CommandSpecError(path, "is not UTF-8 text") from exc
    return text


def _yaml_documents(text: str, path: str) -> Iterator[Any]:
    loader = _Loader(text)
    try:
        while loader.check_data():  # type: ignore[no-untyped-call]
            yield loader.get_data()
    except yaml.YAMLError as exc:
        raise CommandSpecError(path, f"not valid YAML: {_yaml_problem(exc)}") from exc
    finally:
        loader.dispose()


def _yaml_problem(exc: yaml.YAMLError) -> str:
    # Only the problem and its place: the snippet PyYAML adds could quote a secret.
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        return f"{exc.problem or exc.context or 'syntax error'}{where}"
    return "syntax error"


def _json_problem(exc: ValueError) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno}, column {exc.colno}"
    return str(exc)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def check_structure(document: Any, path: str = "") -> None:
    """Refuse a structure that is too deep, too large or not JSON-shaped.

    Raises :class:`CommandSpecError` naming the first offending place.
    """
    budget = MAX_SPEC_BYTES + _STRUCTURE_ALLOWANCE
    nodes = 0
    stack: list[tuple[Any, str, int]] = [(document, path, 0)]
    while stack:
        value, where, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise CommandSpecError(path, f"has more than {MAX_NODES} values")
        if depth > MAX_DEPTH:
            raise CommandSpecError(where, f"is nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            if len(value) > MAX_ITEMS:
                raise CommandSpecError(where, f"has more than {MAX_ITEMS} entries")
            for key, item in value.items():
                if not isinstance(key, str):
                    raise CommandSpecError(where, "has a key that is not a string")
                budget -= len(key)
                stack.append((item, join_path(where, key), depth + 1))
        elif isinstance(value, list):
            if len(value) > MAX_ITEMS:
                raise CommandSpecError(where, f"has more than {MAX_ITEMS} items")
            stack.extend(
                (item, join_path(where, index), depth + 1) for index, item in enumerate(value)
            )
        elif isinstance(value, str):
            budget -= len(value)
        elif isinstance(value, float) and not math.isfinite(value):
            raise CommandSpecError(where, "must be a finite number")
        elif value is not None and not isinstance(value, bool | int | float):
            raise CommandSpecError(where, "must be a string, number, boolean, list or mapping")
        budget -= 1
        if budget < 0:
            raise CommandSpecError(path, f"is larger than {MAX_SPEC_BYTES} bytes")
