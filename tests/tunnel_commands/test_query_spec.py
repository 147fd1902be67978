"""``type: query`` specs (tunnel_commands.query)."""

from __future__ import annotations

from typing import Any

import pytest

from tunnel_commands import (
    DescribeQuery,
    EndpointsQuery,
    GetQuery,
    LogsQuery,
    Query,
    QuerySpec,
    parse_command,
)

from .helpers import command, refused, round_trips


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            {"get": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "web",
                     "name": "api"}},
            GetQuery("apps/v1", "Deployment", "web", "api"),
        ),
        (
            {"get": {"apiVersion": "v1", "kind": "Pod", "namespace": "web",
                     "labelSelector": "app=api,tier!=db"}},
            GetQuery("v1", "Pod", "web", None, "app=api,tier!=db"),
        ),
        ({"get": {"apiVersion": "v1", "kind": "Namespace"}}, GetQuery("v1", "Namespace")),
        (
            {"describe": {"apiVersion": "v1", "kind": "Pod", "namespace": "web", "name": "p"}},
            DescribeQuery("v1", "Pod", "web", "p"),
        ),
        (
            {"logs": {"namespace": "web", "pod": "api-1", "container": "app", "tailLines": 100,
                      "sinceSeconds": 600}},
            LogsQuery("web", "api-1", "app", 100, 600),
        ),
        ({"logs": {"namespace": "web", "pod": "api-1"}}, LogsQuery("web", "api-1")),
        ({"endpoints": {"namespace": "web", "service": "api"}}, EndpointsQuery("web", "api")),
    ],
)  # fmt: skip
def test_each_query_is_read_and_round_trips(spec: dict[str, Any], expected: Query) -> None:
    parsed = parse_command(command("query", spec))
    assert isinstance(parsed.spec, QuerySpec)
    assert parsed.spec.query == expected
    assert type(parsed.spec.query) is type(expected)
    round_trips(parsed)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({}, "spec: needs one of get, describe, logs, endpoints"),
        (
            {"get": {"apiVersion": "v1", "kind": "Pod"}, "logs": {"namespace": "a", "pod": "b"}},
            "spec: must have only one of get, describe, logs, endpoints",
        ),
        ({"get": {"kind": "Pod"}}, "spec.get.apiVersion: required"),
        ({"get": {"apiVersion": "v1"}}, "spec.get.kind: required"),
        ({"get": {"apiVersion": "v1", "kind": "pods"}}, "spec.get.kind: 'pods' is not a kind"),
        (
            {"get": {"apiVersion": "v1", "kind": "Pod", "name": "a", "labelSelector": "x=y"}},
            "spec.get.labelSelector: is only allowed without name",
        ),
        (
            {"get": {"apiVersion": "v1", "kind": "Pod", "labelSelector": "x=$(y)"}},
            "spec.get.labelSelector: 'x=$(y)' is not a label selector",
        ),
        ({"describe": {"apiVersion": "v1", "kind": "Pod"}}, "spec.describe.name: required"),
        ({"logs": {"pod": "p"}}, "spec.logs.namespace: required"),
        ({"logs": {"namespace": "web"}}, "spec.logs.pod: required"),
        (
            {"logs": {"namespace": "web", "pod": "p", "tailLines": 0}},
            "spec.logs.tailLines: must be between 1 and 100000",
        ),
        (
            {"logs": {"namespace": "web", "pod": "p", "sinceSeconds": "10m"}},
            "spec.logs.sinceSeconds: must be an integer",
        ),
        ({"logs": {"namespace": "web", "pod": "p", "follow": True}}, "spec.logs.follow: unknown"),
        ({"endpoints": {"namespace": "web"}}, "spec.endpoints.service: required"),
        ({"endpoints": "api"}, "spec.endpoints: must be a mapping"),
    ],
)
def test_query_errors_name_the_field(spec: dict[str, Any], message: str) -> None:
    assert str(refused(command("query", spec))).startswith(message)
