"""parse_api_request classifies requests as the API server's RequestInfo does."""

from __future__ import annotations

import json

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
        # With an object named, ?watch is ignored: a get, as the API server reads it.
        ("GET", "/api/v1/namespaces/ns/pods/p?watch=1", "get", "ns", "pods", "p", ""),
        ("GET", "/api/v1/namespaces/ns/pods/p/log?watch=true", "get", "ns", "pods", "p", "log"),
        # Any first watch value but 0 and false asks for a watch, a bare one too.
        ("GET", "/api/v1/namespaces/ns/pods?watch", "watch", "ns", "pods", "", ""),
        ("GET", "/api/v1/namespaces/ns/pods?watch=yes", "watch", "ns", "pods", "", ""),
        ("GET", "/api/v1/namespaces/ns/pods?watch=FALSE", "list", "ns", "pods", "", ""),
        # The namespace's own subresources, and the legacy proxy verb.
        ("PUT", "/api/v1/namespaces/ns/finalize", "update", "ns", "namespaces", "ns", "finalize"),
        ("PUT", "/api/v1/namespaces/ns/status", "update", "ns", "namespaces", "ns", "status"),
        ("GET", "/api/v1/proxy/namespaces/ns/pods/p/x", "proxy", "ns", "pods", "p", ""),
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


_HEX = "0123456789abcdefABCDEF"


def _go_unescape(text: str, *, plus: bool) -> str:
    """Go's url.PathUnescape / QueryUnescape (``plus``): ValueError on a bad escape."""
    data = text.encode()
    out = bytearray()
    index = 0
    while index < len(data):
        byte = data[index]
        if byte == 0x25:  # %
            digits = data[index + 1 : index + 3].decode("latin-1")
            if len(digits) != 2 or any(c not in _HEX for c in digits):
                raise ValueError(text)
            out.append(int(digits, 16))
            index += 3
            continue
        out.append(0x20 if byte == 0x2B and plus else byte)
        index += 1
    return out.decode("utf-8", "replace")


def _go_query(raw: str) -> dict[str, list[str]]:
    """Go's url.ParseQuery: pairs holding ``;`` or a bad escape are passed over."""
    values: dict[str, list[str]] = {}
    for part in raw.split("&"):
        if not part or ";" in part:
            continue
        name, _, value = part.partition("=")
        try:
            name, value = _go_unescape(name, plus=True), _go_unescape(value, plus=True)
        except ValueError:
            continue
        values.setdefault(name, []).append(value)
    return values


def _request_info(method: str, target: str) -> ApiRequest:
    """k8s.io/apiserver's RequestInfoFactory.NewRequestInfo, ported: the reference."""
    path, _, query = target.partition("#")[0].partition("?")
    decoded = _go_unescape(path, plus=False)
    parts = decoded.strip("/").split("/") if decoded.strip("/") else []
    lower = method.lower()
    if len(parts) < 3 or parts[0] not in ("api", "apis"):
        return ApiRequest(verb=lower, is_resource=False, path=path)
    current = parts[1:]
    group = ""
    if parts[0] == "apis":
        if len(current) < 3:
            return ApiRequest(verb=lower, is_resource=False, path=path)
        group, current = current[0], current[1:]
    version, current = current[0], current[1:]
    verbs = {"POST": "create", "GET": "get", "HEAD": "get", "PUT": "update"}
    verbs |= {"PATCH": "patch", "DELETE": "delete"}
    verb = verbs.get(method, lower)
    if current[0] in ("proxy", "watch"):
        if len(current) < 2:
            return ApiRequest(verb=lower, is_resource=False, path=path)  # an error there
        # The one deliberate difference: /watch/ with a method other than GET
        # or HEAD, which the API server authorizes as a watch and then has no
        # route for, is read as its method says (stricter).
        if current[0] == "proxy" or method in ("GET", "HEAD"):
            verb = current[0]
        current = current[1:]
    namespace = ""
    if current[0] == "namespaces" and len(current) > 1:
        namespace = current[1]
        if len(current) > 2 and current[2] not in ("status", "finalize"):
            current = current[2:]
    subresource = current[2] if len(current) >= 3 and verb != "proxy" else ""
    name = current[1] if len(current) >= 2 else ""
    if not name and verb == "get":
        watch = _go_query(query).get("watch", [])
        asked = bool(watch) and watch[0] != "0" and watch[0].casefold() != "false"
        verb = "watch" if asked else "list"
    if not name and verb == "delete":
        verb = "deletecollection"
    return ApiRequest(verb, True, path, group, version, namespace, current[0], subresource, name)


_SEGMENT = st.sampled_from(
    [
        "api",
        "apis",
        "apps",
        "v1",
        "watch",
        "proxy",
        "namespaces",
        "ns",
        "pods",
        "p",
        "log",
        "status",
        "finalize",
        "console",
        "%7E",
        "n%73",
    ]
)
_QUERY = st.sampled_from(
    [
        "",
        "watch=1",
        "watch=true",
        "watch=0",
        "watch=",
        "watch",
        "watch=yes",
        "watch=FALSE",
        "w%61tch=1",
        "watch=TRUE",
        "watch=tru%65",
        "watch=f%61lse",
        "a=b&watch=1",
        "watch=&watch=1",
        "watch=0&watch=1",
        "watch=%zz&watch=0",
        "watch=1;x=y&watch=0",
        "watch+=1",
        "watching=1",
        "x=watch",
    ]
)


@given(
    st.sampled_from(["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"]),
    st.lists(_SEGMENT, max_size=8),
    _QUERY,
)
def test_agrees_with_the_api_servers_request_info(
    method: str, segments: list[str], query: str
) -> None:
    target = "/" + "/".join(segments) + (f"?{query}" if query else "")
    assert parse_api_request(method, target) == _request_info(method, target)


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
