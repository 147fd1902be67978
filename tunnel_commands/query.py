"""``type: query``: read the cluster's state, answered as a bounded structured result.

::

    spec:
      get: {apiVersion: apps/v1, kind: Deployment, namespace: web, name: api}
          # name left out: a list, optionally narrowed by labelSelector
      # describe: {apiVersion: v1, kind: Pod, namespace: web, name: api-1}   (+ its events)
      # logs: {namespace: web, pod: api-1, container: app, tailLines: 100, sinceSeconds: 600}
      # endpoints: {namespace: web, service: api}
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from .errors import CommandSpecError
from .fields import DNS_LABEL, DNS_SUBDOMAIN, Fields
from .values import Scope

__all__ = [
    "DescribeQuery",
    "EndpointsQuery",
    "GetQuery",
    "LogsQuery",
    "Query",
    "QuerySpec",
    "parse_query",
]

_API_VERSION = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?v[0-9]+[a-z0-9]*$")
_KIND = re.compile(r"^[A-Z][A-Za-z0-9]{0,62}$")
_OBJECT_NAME = re.compile(r"^[^/%\s][^/%\s]{0,252}$")
_SELECTOR = re.compile(r"^[A-Za-z0-9._/=!,() -]{1,1024}$")
_CONTAINER = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True, slots=True)
class GetQuery:
    """One object (``name``) or a list, like ``kubectl get``."""

    OPERATION: ClassVar[str] = "get"

    api_version: str
    kind: str
    namespace: str | None = None
    name: str | None = None
    label_selector: str | None = None

    def to_dict(self) -> dict[str, Any]:
        result = {"apiVersion": self.api_version, "kind": self.kind}
        for key, value in (
            ("namespace", self.namespace),
            ("name", self.name),
            ("labelSelector", self.label_selector),
        ):
            if value is not None:
                result[key] = value
        return result


@dataclass(frozen=True, slots=True)
class DescribeQuery(GetQuery):
    """One object and the events about it, like ``kubectl describe``."""

    OPERATION: ClassVar[str] = "describe"


@dataclass(frozen=True, slots=True)
class LogsQuery:
    """A pod's log, like ``kubectl logs``."""

    OPERATION: ClassVar[str] = "logs"

    namespace: str
    pod: str
    container: str | None = None
    tail_lines: int | None = None
    since_seconds: int | None = None

    def to_dict(self) -> dict[str, Any]:
        result: dict[str, Any] = {"namespace": self.namespace, "pod": self.pod}
        for key, value in (
            ("container", self.container),
            ("tailLines", self.tail_lines),
            ("sinceSeconds", self.since_seconds),
        ):
            if value is not None:
                result[key] = value
        return result


@dataclass(frozen=True, slots=True)
class EndpointsQuery:
    """The ready and not-ready addresses behind a Service."""

    OPERATION: ClassVar[str] = "endpoints"

    namespace: str
    service: str

    def to_dict(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "service": self.service}


Query = GetQuery | DescribeQuery | LogsQuery | EndpointsQuery


@dataclass(frozen=True, slots=True)
class QuerySpec:
    """A read of the cluster's state."""

    TYPE: ClassVar[str] = "query"

    query: Query

    def to_dict(self) -> dict[str, Any]:
        return {self.query.OPERATION: self.query.to_dict()}


def parse_query(fields: Fields, scope: Scope) -> QuerySpec:
    del scope  # a query takes no references
    operation = fields.one_of(("get", "describe", "logs", "endpoints"))
    inner = fields.mapping(operation, required=True)
    assert inner is not None
    query: Query
    if operation in ("get", "describe"):
        query = _parse_get(inner, describe=operation == "describe")
    elif operation == "logs":
        query = LogsQuery(
            namespace=inner.string("namespace", pattern=DNS_LABEL, rule="a namespace name"),
            pod=inner.string("pod", pattern=DNS_SUBDOMAIN, rule="a pod name"),
            container=inner.optional_string(
                "container", pattern=_CONTAINER, rule="a container name"
            ),
            tail_lines=inner.integer("tailLines", None, minimum=1, maximum=100_000),
            since_seconds=inner.integer("sinceSeconds", None, minimum=1, maximum=30 * 86400),
        )
    else:
        query = EndpointsQuery(
            namespace=inner.string("namespace", pattern=DNS_LABEL, rule="a namespace name"),
            service=inner.string("service", pattern=DNS_LABEL, rule="a service name"),
        )
    inner.finish()
    fields.finish()
    return QuerySpec(query)


def _parse_get(fields: Fields, *, describe: bool) -> GetQuery:
    api_version = fields.string(
        "apiVersion", pattern=_API_VERSION, rule="an apiVersion such as v1 or apps/v1"
    )
    kind = fields.string("kind", pattern=_KIND, rule="a kind such as Deployment")
    namespace = fields.optional_string("namespace", pattern=DNS_LABEL, rule="a namespace name")
    if describe:
        name: str | None = fields.string("name", pattern=_OBJECT_NAME, rule="an object name")
    else:
        name = fields.optional_string("name", pattern=_OBJECT_NAME, rule="an object name")
    selector = fields.optional_string(
        "labelSelector", pattern=_SELECTOR, rule="a label selector", max_length=1024
    )
    if name is not None and selector is not None:
        raise CommandSpecError(fields.path_of("labelSelector"), "is only allowed without name")
    cls = DescribeQuery if describe else GetQuery
    return cls(api_version, kind, namespace, name, selector)
