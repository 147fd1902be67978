"""The agent's own policy, checked before any request reaches the API server."""

from __future__ import annotations

from urllib.parse import parse_qsl

import pytest

from protocol.http import RequestHead
from tunnel_agent.policy import ProxyPolicy, Refusal

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
    request = head(method, path)
    assert ProxyPolicy(read_only=True).check(request) is request


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
    assert isinstance(refusal, Refusal)
    assert refusal.status == 403
    assert "read-only" in refusal.message
    assert word in refusal.message


def test_writable_agent_allows_writes_and_exec() -> None:
    policy = ProxyPolicy()
    for request in (
        head("DELETE", "/api/v1/namespaces/default/pods/web"),
        head("GET", "/api/v1/namespaces/default/pods/web/exec"),
    ):
        assert policy.check(request) is request


def test_namespace_scope_refuses_other_namespaces_and_cluster_wide_requests() -> None:
    policy = ProxyPolicy(namespaces=frozenset({"team-a"}))
    for path in ("/api/v1/namespaces/team-a/pods", "/api/v1/namespaces/team-a", "/apis"):
        request = head("GET", path)  # discovery is not a resource
        assert policy.check(request) is request
    for path in ("/api/v1/namespaces/team-b/pods", "/api/v1/pods", "/api/v1/nodes"):
        refusal = policy.check(head("GET", path))
        assert isinstance(refusal, Refusal), path
        assert "team-a" in refusal.message


CONSOLE = "/apis/subresources.kubevirt.io/v1/namespaces/team/virtualmachineinstances/vm/console"


def test_read_only_refuses_an_interactive_session_on_a_subresource_read_as_a_get() -> None:
    """A VM's console is a get to RBAC and an upgrade on the wire: exec by another name."""
    refusal = ProxyPolicy(read_only=True).check(RequestHead("GET", CONSOLE, ALICE, upgrade=True))
    assert isinstance(refusal, Refusal)
    assert refusal.status == 403
    assert "read-only: an interactive connection to 'console'" in refusal.message
    writable = RequestHead("GET", CONSOLE, ALICE, upgrade=True)
    assert ProxyPolicy().check(writable) is writable


@pytest.mark.parametrize(
    "target",
    [
        CONSOLE + "?watch=true",
        CONSOLE + "?watch=1&x=y",
        # /watch/ makes a watch of anything to RBAC, a subresource included.
        CONSOLE.replace("/v1/", "/v1/watch/"),
        "/api/v1/namespaces/team/pods/web/log?watch=1",
    ],
)
def test_read_only_refuses_an_interactive_session_disguised_as_a_watch(target: str) -> None:
    """?watch on a named object is a get to the API server: the upgrade is the console's."""
    refusal = ProxyPolicy(read_only=True).check(RequestHead("GET", target, ALICE, upgrade=True))
    assert isinstance(refusal, Refusal)
    assert refusal.status == 403
    assert "read-only: an interactive connection" in refusal.message


def test_read_only_refuses_the_legacy_proxy_verb() -> None:
    path = "/api/v1/proxy/namespaces/team/pods/web/shutdown"
    refusal = ProxyPolicy(read_only=True).check(head("GET", path))
    assert isinstance(refusal, Refusal)
    assert refusal.message == "this agent is read-only: proxy is not allowed"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("PATCH", "/api/v1/namespaces/team"),
        ("PUT", "/api/v1/namespaces/team"),
        ("DELETE", "/api/v1/namespaces/team"),
        ("PUT", "/api/v1/namespaces/team/finalize"),
        ("PATCH", "/api/v1/namespaces/team/status"),
    ],
)
def test_a_scoped_agent_refuses_changes_to_its_namespace_object(method: str, path: str) -> None:
    """Its Pod Security labels, finalizers and its deletion are the cluster owner's."""
    policy = ProxyPolicy(namespaces=frozenset({"team"}))
    refusal = policy.check(head(method, path))
    assert isinstance(refusal, Refusal)
    assert refusal.message == (
        "this agent serves what is in namespaces team, not changes to the Namespace object "
        "'team' itself"
    )
    for read in ("/api/v1/namespaces/team", "/api/v1/namespaces/team/status"):
        request = head("GET", read)
        assert policy.check(request) is request


def test_read_only_lets_a_watch_over_a_websocket_through() -> None:
    request = RequestHead("GET", "/api/v1/namespaces/team/pods?watch=1", ALICE, upgrade=True)
    assert ProxyPolicy(read_only=True).check(request) is request


@pytest.mark.parametrize(
    "path",
    [
        "/apis/evil.example.com/v1/namespaces/kube-system/selfsubjectreviews",
        "/apis/evil.example.com/v1/selfsubjectaccessreviews",
        "/apis/authorization.k8s.io/v1/namespaces/kube-system/selfsubjectaccessreviews",
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews/x/status",
    ],
)
def test_only_the_real_self_reviews_pass_a_read_only_or_scoped_agent(path: str) -> None:
    for policy in (ProxyPolicy(read_only=True), ProxyPolicy(namespaces=frozenset({"team"}))):
        refusal = policy.check(head("POST", path))
        assert isinstance(refusal, Refusal), (policy, path)
        assert refusal.status == 403


def test_a_scoped_agent_answers_self_reviews_wherever_they_ask_about() -> None:
    policy = ProxyPolicy(read_only=True, namespaces=frozenset({"team"}))
    for path in (
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
    ):
        request = head("POST", path)
        assert policy.check(request) is request


@pytest.mark.parametrize(
    "path",
    [
        "/api",
        "/api/v1",
        "/apis/apps/v1",
        "/version",
        "/openapi/v3/apis/apps/v1",
        "/healthz",
        "/livez/ping",
        "/.well-known/openid-configuration",
        "/openid/v1/jwks",
    ],
)
def test_a_scoped_agent_serves_discovery_version_openapi_and_health(path: str) -> None:
    request = head("GET", path)
    assert ProxyPolicy(namespaces=frozenset({"team"})).check(request) is request


@pytest.mark.parametrize(
    "path", ["/logs/kube-apiserver.log", "/metrics", "/debug/pprof/goroutine", "/apiserver", "/"]
)
def test_a_scoped_agent_refuses_the_api_servers_own_paths(path: str) -> None:
    refusal = ProxyPolicy(namespaces=frozenset({"team"})).check(head("GET", path))
    assert isinstance(refusal, Refusal)
    assert refusal.message == f"this agent serves namespaces team only, not {path!r}"


SECRETS = "/api/v1/namespaces/default/secrets"
#: What kubectl get sends: Tables first, plain JSON as a fallback.
KUBECTL_ACCEPT = (
    "application/json;as=Table;v=v1;g=meta.k8s.io,"
    "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
)
TABLE_ONLY = (
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io"
)


def narrowed(request: RequestHead) -> RequestHead:
    checked = ProxyPolicy().check(request)
    assert isinstance(checked, RequestHead), checked
    return checked


def accept_of(request: RequestHead) -> list[str]:
    return [value for name, value in request.headers if name == "accept"]


def refusal_of(request: RequestHead) -> Refusal:
    checked = ProxyPolicy().check(request)
    assert isinstance(checked, Refusal), checked
    assert checked.status == 403
    assert "--allow-secret-values" in checked.message
    return checked


@pytest.mark.parametrize(
    "path", [SECRETS, f"{SECRETS}/db", "/api/v1/secrets", f"{SECRETS}?watch=1"]
)
def test_secrets_as_json_are_refused(path: str) -> None:
    refusal = refusal_of(head("GET", path, ("accept", "application/json")))
    assert "a table of their names is" in refusal.message


def test_a_table_of_secrets_goes_on_as_a_table_only_without_even_their_metadata() -> None:
    request = narrowed(head("GET", f"{SECRETS}?limit=500", ("accept", KUBECTL_ACCEPT)))
    assert accept_of(request) == [TABLE_ONLY]  # the JSON fallback is gone
    assert request.path == f"{SECRETS}?limit=500&includeObject=None"
    assert request.headers[:2] == ALICE


@pytest.mark.parametrize(
    "accept",
    [
        # A range the API server reads as JSON, ahead of a decoy "as=Table".
        "application/json, text/x;as=Table",
        "application/json;x=as=Table",
        "application/json;as=Tables;g=meta.k8s.io;v=v1",
        # Two "as": the API server keeps the last.
        "application/json;as=Table;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
        "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
        "application/json;as=Table;g=example.com;v=v1",
        "application/vnd.kubernetes.protobuf;as=Table;g=meta.k8s.io;v=v1",
        "*/*",
        "",
    ],
)
def test_an_accept_header_is_a_table_only_if_the_api_server_must_read_it_as_one(
    accept: str,
) -> None:
    refusal_of(head("GET", SECRETS, ("accept", accept)))


def test_a_table_range_is_written_anew_keeping_only_what_was_checked() -> None:
    accept = " application/JSON ; as=Table ; g=meta.k8s.io ; v=v1 ; q=0.9 , application/json"
    request = narrowed(head("GET", SECRETS, ("accept", accept), ("accept", "application/json")))
    assert accept_of(request) == ["application/json;as=Table;v=v1;g=meta.k8s.io"]


@pytest.mark.parametrize(
    "query",
    ["includeObject=Object", "include%4Fbject=Object", "INCLUDEOBJECT=Object", "includeObject=x"],
)
def test_a_table_carrying_the_objects_is_refused(query: str) -> None:
    refusal = refusal_of(head("GET", f"{SECRETS}?{query}", ("accept", KUBECTL_ACCEPT)))
    assert "includeObject='" in refusal.message


def test_the_callers_text_in_a_refusal_is_escaped() -> None:
    """It goes into the agent's log: a newline must not start a line of its own."""
    refusal = refusal_of(
        head("GET", f"{SECRETS}?includeObject=x%0Afake+log+line", ("accept", KUBECTL_ACCEPT))
    )
    assert "\n" not in refusal.message
    assert "includeObject='x\\nfake log line'" in refusal.message


@pytest.mark.parametrize(
    "query", ["includeObject=Metadata", "includeObject=None&includeObject=Metadata"]
)
def test_a_table_asking_for_metadata_gets_none(query: str) -> None:
    request = narrowed(head("GET", f"{SECRETS}/db?{query}", ("accept", KUBECTL_ACCEPT)))
    assert request.path == f"{SECRETS}/db?includeObject=None"


def test_other_query_parameters_reach_the_api_server_as_they_meant() -> None:
    query = "labelSelector=app%3Dweb%2Ctier+in+%28a%29&watch=1&resourceVersion=7"
    request = narrowed(head("GET", f"{SECRETS}?{query}", ("accept", KUBECTL_ACCEPT)))
    path, _, rewritten = request.path.partition("?")
    assert path == SECRETS
    assert parse_qsl(rewritten) == [
        ("labelSelector", "app=web,tier in (a)"),
        ("watch", "1"),
        ("resourceVersion", "7"),
        ("includeObject", "None"),
    ]


@pytest.mark.parametrize(
    ("method", "path", "verb"),
    [
        ("POST", SECRETS, "create"),
        ("PUT", f"{SECRETS}/db", "update"),
        ("PATCH", f"{SECRETS}/db?dryRun=All", "patch"),
        ("DELETE", f"{SECRETS}/db", "delete"),
        ("DELETE", SECRETS, "deletecollection"),
    ],
)
def test_writes_to_secrets_are_refused_since_their_answer_carries_the_values(
    method: str, path: str, verb: str
) -> None:
    refusal = refusal_of(head(method, path, ("accept", KUBECTL_ACCEPT)))
    assert f"answer to a {verb} would carry their values" in refusal.message


def test_with_secret_values_allowed_secrets_pass_unchanged() -> None:
    allowing = ProxyPolicy(allow_secret_values=True)
    for request in (
        head("GET", f"{SECRETS}/db?includeObject=Object", ("accept", "application/json")),
        head("PATCH", f"{SECRETS}/db"),
    ):
        assert allowing.check(request) is request


def test_other_resources_named_secrets_are_not_secrets() -> None:
    request = head("GET", "/apis/example.com/v1/namespaces/default/secrets")
    assert ProxyPolicy().check(request) is request


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
    assert isinstance(refusal, Refusal)
    assert refusal.status == 403


@pytest.mark.parametrize(
    "path",
    [
        # kube-apiserver decodes before it routes: each of these names Secrets.
        f"{SECRETS}%2Fdb",
        "/api/v1/namespaces/default%2Fsecrets",
        "/api%2Fv1%2Fsecrets",
        "/api/v1/namespaces/default/pods/../secrets",
        "/api/v1/namespaces/default//secrets",
        "/api/v1/namespaces/default/secrets%2e",
        "/api/v1/namespaces\\default",
        # The policy would read up to the "#", the API server the whole path.
        "/api/v1/namespaces/ok/pods/#/exec",
    ],
)
def test_a_path_the_api_server_could_read_otherwise_is_refused_whatever_the_server_allowed(
    path: str,
) -> None:
    for policy in (ProxyPolicy(), ProxyPolicy(allow_secret_values=True)):
        refusal = policy.check(head("GET", path, ("accept", "application/json")))
        assert isinstance(refusal, Refusal)
        assert (refusal.status, refusal.message) == (
            400,
            "the path must not contain dot or encoded segments",
        )


def test_an_encoded_letter_is_read_as_the_api_server_reads_it() -> None:
    refusal = ProxyPolicy().check(head("GET", "/api/v1/namespaces/default/%73ecrets"))
    assert isinstance(refusal, Refusal)
    assert "--allow-secret-values" in refusal.message
