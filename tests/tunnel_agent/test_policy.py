"""The agent's own policy, checked before any request reaches the API server."""

from __future__ import annotations

import pytest

from protocol.http import RequestHead
from tunnel_agent.policy import ProxyPolicy

ALICE = (("impersonate-user", "tunnel:alice"), ("impersonate-group", "tunnel:platform"))


def head(method: str, path: str, *extra: tuple[str, str], identity: bool = True) -> RequestHead:
    return RequestHead(method, path, (ALICE if identity else ()) + tuple(extra))


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/v1/namespaces/default/pods"),
        ("GET", "/api/v1/namespaces/default/pods?watch=1"),
        ("GET", "/api/v1/namespaces/default/pods/web/log?follow=true"),
        ("GET", "/apis"),
        ("GET", "/version"),
        ("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"),
        ("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews"),
    ],
)
def test_read_only_allows_reads_logs_discovery_and_self_reviews(method: str, path: str) -> None:
    assert ProxyPolicy(read_only=True).check(head(method, path)) is None


@pytest.mark.parametrize(
    ("method", "path", "word"),
    [
        ("POST", "/api/v1/namespaces/default/configmaps", "create"),
        ("PATCH", "/apis/apps/v1/namespaces/default/deployments/web", "patch"),
        ("DELETE", "/api/v1/namespaces/default/pods/web", "delete"),
        ("PUT", "/api/v1/namespaces/default/configmaps/c", "update"),
        ("GET", "/api/v1/namespaces/default/pods/web/exec?command=sh", "exec"),
        ("POST", "/api/v1/namespaces/default/pods/web/portforward", "portforward"),
        ("GET", "/api/v1/namespaces/default/pods/web/attach", "attach"),
    ],
)
def test_read_only_refuses_writes_exec_and_port_forward(method: str, path: str, word: str) -> None:
    refusal = ProxyPolicy(read_only=True).check(head(method, path))
    assert refusal is not None
    assert refusal.status == 403
    assert "read-only" in refusal.message
    assert word in refusal.message


def test_writable_agent_allows_writes_and_exec() -> None:
    policy = ProxyPolicy()
    assert policy.check(head("DELETE", "/api/v1/namespaces/default/pods/web")) is None
    assert policy.check(head("GET", "/api/v1/namespaces/default/pods/web/exec")) is None


def test_namespace_scope_refuses_other_namespaces_and_cluster_wide_requests() -> None:
    policy = ProxyPolicy(namespaces=frozenset({"team-a"}))
    assert policy.check(head("GET", "/api/v1/namespaces/team-a/pods")) is None
    assert policy.check(head("GET", "/api/v1/namespaces/team-a")) is None
    assert policy.check(head("GET", "/apis")) is None  # discovery is not a resource
    for path in ("/api/v1/namespaces/team-b/pods", "/api/v1/pods", "/api/v1/nodes"):
        refusal = policy.check(head("GET", path))
        assert refusal is not None, path
        assert "team-a" in refusal.message


def test_secret_values_are_withheld_but_tables_of_names_pass() -> None:
    policy = ProxyPolicy()
    for path in ("/api/v1/namespaces/default/secrets", "/api/v1/namespaces/default/secrets/db"):
        refusal = policy.check(head("GET", path))
        assert refusal is not None
        assert "--allow-secret-values" in refusal.message
    table = ("accept", "application/json;as=Table;v=v1;g=meta.k8s.io,application/json")
    assert policy.check(head("GET", "/api/v1/namespaces/default/secrets", table)) is None
    assert policy.check(head("DELETE", "/api/v1/namespaces/default/secrets/db")) is None
    allowing = ProxyPolicy(allow_secret_values=True)
    assert allowing.check(head("GET", "/api/v1/namespaces/default/secrets/db")) is None


@pytest.mark.parametrize(
    "headers",
    [
        (),
        (("impersonate-user", "system:admin"),),
        (("impersonate-user", "tunnel:alice"), ("impersonate-group", "system:masters")),
        (("impersonate-user", "tunnel:system:admin"),),
        (("impersonate-user", "tunnel:alice"), ("impersonate-uid", "1")),
        (("impersonate-user", "tunnel:a"), ("impersonate-user", "tunnel:b")),
    ],
)
def test_requests_without_a_tunnel_identity_are_refused(
    headers: tuple[tuple[str, str], ...],
) -> None:
    refusal = ProxyPolicy().check(RequestHead("GET", "/api/v1/pods", headers))
    assert refusal is not None
    assert refusal.status == 403
