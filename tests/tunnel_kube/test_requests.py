"""parse_api_request classifies requests as the API server's RequestInfo does."""

from __future__ import annotations

import json
from urllib.parse import parse_qs, unquote, urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tunnel_kube import parse_api_request, status_body
from tunnel_kube.requests import ApiRequest


@pytest.mark.parametrize(
    ("method", "target", "verb", "namespace", "resource", "name", "subresource"),
    [
        ("GET", "/api/v1/pods", "list", "", "pods", "", ""),
        ("GET", "/api/v1/namespaces/default/pods?watch=1", "watch", "default", "pods", "", ""),
        (
            "GET",
            "/api/v1/namespaces/default/pods?watch=true&x=1",
            "watch",
            "default",
            "pods",
            "",
            "",
        ),
        ("GET", "/api/v1/namespaces/default/pods?watch=false", "list", "default", "pods", "", ""),
        (
            "GET",
            "/api/v1/namespaces/default/pods?watch=&watch=1",
            "watch",
            "default",
            "pods",
            "",
            "",
        ),
        ("GET", "/api/v1/watch/namespaces/ns/pods", "watch", "ns", "pods", "", ""),
        ("GET", "/api/v1/namespaces/ns/pods/p1/log?follow=true", "get", "ns", "pods", "p1", "log"),
        (
            "POST",
            "/api/v1/namespaces/ns/pods/p1/exec?command=ls",
            "create",
            "ns",
            "pods",
            "p1",
            "exec",
        ),
        (
            "DELETE",
            "/apis/apps/v1/namespaces/ns/deployments",
            "deletecollection",
            "ns",
            "deployments",
            "",
            "",
        ),
        (
            "PATCH",
            "/apis/apps/v1/namespaces/ns/deployments/web",
            "patch",
            "ns",
            "deployments",
            "web",
            "",
        ),
        ("GET", "/api/v1/namespaces/ns", "get", "ns", "namespaces", "ns", ""),
        ("GET", "/api/v1/namespaces/a%2Fb/pods", "list", "a/b", "pods", "", ""),
    ],
)
def test_resource_requests_are_classified(
    method: str, target: str, verb: str, namespace: str, resource: str, name: str, subresource: str
) -> None:
    request = parse_api_request(method, target)
    assert request.is_resource
    assert (
        request.verb,
        request.namespace,
        request.resource,
        request.name,
        request.subresource,
    ) == (
        verb,
        namespace,
        resource,
        name,
        subresource,
    )


@pytest.mark.parametrize(
    "target", ["/", "/api", "/apis/apps", "/version", "/openapi/v2?x=1", "/api/v1/watch"]
)
def test_non_resource_requests_keep_the_lower_case_method(target: str) -> None:
    request = parse_api_request("GET", target)
    assert not request.is_resource
    assert request.verb == "get"
    assert request.path == target.partition("?")[0]


def _former_parse(method: str, target: str) -> ApiRequest:
    """The former implementation, on urlsplit and parse_qs (with the /watch fix): the reference."""
    split = urlsplit(target)
    path = split.path
    parts = [unquote(part) for part in path.strip("/").split("/")] if path.strip("/") else []
    lower = method.lower()
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return ApiRequest(verb=lower, is_resource=False, path=path)
    if not rest:
        return ApiRequest(verb=lower, is_resource=False, path=path)
    watch_prefix = rest[0] == "watch"
    if watch_prefix:
        rest = rest[1:]
        if not rest:
            # /api/v1/watch alone names nothing (the API server refuses it).
            return ApiRequest(verb=lower, is_resource=False, path=path)
    namespace = ""
    if len(rest) >= 2 and rest[0] == "namespaces":
        namespace = rest[1]
        if len(rest) >= 3:
            rest = rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) >= 2 else ""
    subresource = rest[2] if len(rest) >= 3 else ""
    watching = watch_prefix or parse_qs(split.query).get("watch", [""])[0].lower() in ("1", "true")
    if method in ("GET", "HEAD"):
        verb = "watch" if watching else ("get" if name else "list")
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, lower)
    return ApiRequest(verb, True, path, group, version, namespace, resource, subresource, name)


_SEGMENT = st.sampled_from(
    ["api", "apis", "apps", "v1", "watch", "namespaces", "ns", "pods", "p", "log", "a%2Fb", "%7E"]
)
_QUERY = st.sampled_from(
    [
        "",
        "watch=1",
        "watch=true",
        "watch=0",
        "watch=",
        "w%61tch=1",
        "watch=TRUE",
        "watch=tru%65",
        "a=b&watch=1",
        "watch=&watch=1",
        "watch+=1",
        "watching=1",
        "x=watch",
    ]
)


@given(
    st.sampled_from(["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"]),
    st.lists(_SEGMENT, max_size=7),
    _QUERY,
)
def test_agrees_with_the_urlsplit_and_parse_qs_reading(
    method: str, segments: list[str], query: str
) -> None:
    target = "/" + "/".join(segments) + (f"?{query}" if query else "")
    assert parse_api_request(method, target) == _former_parse(method, target)


def test_a_repeated_request_reads_the_same_whatever_its_length() -> None:
    short = "/api/v1/namespaces/default/pods/web-0?timeout=32s"
    long = "/api/v1/namespaces/default/pods/" + "x" * 600  # past what is remembered
    for target in (short, long):
        first, again = parse_api_request("GET", target), parse_api_request("GET", target)
        assert first == again
        assert (first.verb, first.resource, first.namespace) == ("get", "pods", "default")
    assert parse_api_request("DELETE", short).verb == "delete"  # the method is part of the key


def test_status_body_is_a_kubernetes_failure_status() -> None:
    body = json.loads(status_body(403, "Forbidden", "no grant"))
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "no grant",
        "reason": "Forbidden",
        "code": 403,
    }
