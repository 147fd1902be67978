"""Label and field selectors, parsed and matched as the API server does.

Label selectors: ``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x)``,
``a``, ``!a``, joined by commas. Field selectors: ``path=value``,
``path==value``, ``path!=value`` over the fields each resource supports
(``metadata.name`` and ``metadata.namespace`` everywhere, a few more per kind);
any other field is a 400, as on a real server.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.kubestub.kinds import ResourceKind
from tests.kubestub.status import bad_request

__all__ = ["Selector", "parse_field_selector", "parse_label_selector"]

_MAX_SELECTOR = 4096
_KEY = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_./]*)?[A-Za-z0-9]$")
_SET_TERM = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")

_FIELDS: dict[str, tuple[str, ...]] = {
    "pods": (
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    ),
    "events": (
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    ),
    "secrets": ("type",),
    "namespaces": ("status.phase",),
    "jobs": ("status.successful",),
}

Matcher = Callable[[dict[str, Any]], bool]


@dataclass(frozen=True, slots=True)
class Selector:
    """A parsed selector: its text and the predicate over objects it stands for."""

    text: str
    matches: Matcher

    @classmethod
    def everything(cls) -> Selector:
        """The empty selector, which matches every object."""
        return cls("", lambda _obj: True)


def parse_label_selector(text: str | None) -> Selector:
    """Parse a ``labelSelector`` query value (None or empty: everything)."""
    if not text:
        return Selector.everything()
    if len(text) > _MAX_SELECTOR:
        raise bad_request("labelSelector is too long")
    terms = [_label_term(term) for term in _split_terms(text)]

    def matches(obj: dict[str, Any]) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        return all(term(labels) for term in terms)

    return Selector(text, matches)


def _split_terms(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    terms: list[str] = []
    depth = 0
    current = ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    terms.append(current)
    return [term.strip() for term in terms if term.strip()]


def _label_term(term: str) -> Callable[[dict[str, str]], bool]:
    set_match = _SET_TERM.match(term)
    if set_match:
        key, operator, values_text = set_match.groups()
        _check_key(key, term)
        values = {value.strip() for value in values_text.split(",") if value.strip()}
        if operator == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    for operator in ("!=", "==", "="):
        if operator in term:
            key, _, value = term.partition(operator)
            key, value = key.strip(), value.strip()
            _check_key(key, term)
            if operator == "!=":
                return lambda labels: labels.get(key) != value
            return lambda labels: labels.get(key) == value
    if term.startswith("!"):
        key = term[1:].strip()
        _check_key(key, term)
        return lambda labels: key not in labels
    _check_key(term, term)
    return lambda labels: term in labels


def _check_key(key: str, term: str) -> None:
    if not _KEY.match(key):
        raise bad_request(f'unable to parse requirement: invalid label key "{key}" in "{term}"')


def parse_field_selector(text: str | None, kind: ResourceKind) -> Selector:
    """Parse a ``fieldSelector`` for ``kind``; unsupported fields are a 400."""
    if not text:
        return Selector.everything()
    if len(text) > _MAX_SELECTOR:
        raise bad_request("fieldSelector is too long")
    allowed = ("metadata.name", "metadata.namespace", *_FIELDS.get(kind.plural, ()))
    terms: list[Matcher] = []
    for term in _split_terms(text):
        for operator in ("!=", "==", "="):
            if operator in term:
                path, _, value = term.partition(operator)
                path, value = path.strip(), value.strip()
                break
        else:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{term}'")
        if path not in allowed:
            raise bad_request(f"field label not supported: {path}")
        terms.append(_field_term(path, value, negate=operator == "!="))

    def matches(obj: dict[str, Any]) -> bool:
        return all(term(obj) for term in terms)

    return Selector(text, matches)


def _field_term(path: str, value: str, *, negate: bool) -> Matcher:
    parts = path.split(".")

    def matches(obj: dict[str, Any]) -> bool:
        current: Any = obj
        for part in parts:
            current = current.get(part) if isinstance(current, dict) else None
        if isinstance(current, bool):
            text = "true" if current else "false"
        elif current is None:
            text = ""
        else:
            text = str(current)
        return (text == value) != negate

    return matches
