"""The agent on its own: no word of a client's address reaches the API server, and no
identity header in disguise passes its policy, whatever the server sent.

Found in an outside review: ``X-Real-Ip`` (which kube-apiserver writes into its
audit events' source addresses), ``Forwarded``, ``X-Client-Ip`` and
``True-Client-Ip`` went on to the API server; ``Impersonate_User`` and
``X_Remote_User``, which a proxy in front of it that reads "_" as "-" would
honour, passed the identity check. The server's side is in
tests/tunnel_server/proxy/test_identity_headers.py.
"""

from __future__ import annotations

import pytest

from protocol.http import RequestHead
from tunnel_agent.kubeproxy import _forwarded
from tunnel_agent.policy import ProxyPolicy, Refusal

ALICE = (("impersonate-user", "tunnel:alice"), ("impersonate-group", "tunnel:platform"))


def head(*extra: tuple[str, str]) -> RequestHead:
    return RequestHead("GET", "/api/v1/namespaces/default/pods", ALICE + extra)


@pytest.mark.parametrize(
    ("name", "folded"),
    [
        ("impersonate_user", "impersonate-user"),
        ("impersonate_group", "impersonate-group"),
        ("impersonate_uid", "impersonate-uid"),
        ("impersonate_extra_scopes", "impersonate-extra-scopes"),
        ("x_remote_user", "x-remote-user"),
        ("x-remote_group", "x-remote-group"),
        ("x_remote_extra_scopes", "x-remote-extra-scopes"),
    ],
)
def test_an_identity_header_spelled_with_an_underscore_is_refused(name: str, folded: str) -> None:
    for policy in (ProxyPolicy(), ProxyPolicy(read_only=True, allow_secret_values=True)):
        refusal = policy.check(head((name, "system:masters")))
        assert refusal == Refusal(
            403,
            "Forbidden",
            f"the {name} header is not allowed: a proxy that reads '_' as '-' would take it "
            f"for {folded}, which names an identity",
        )


def test_a_request_without_our_identity_is_refused_even_with_one_in_disguise() -> None:
    refusal = ProxyPolicy().check(RequestHead("GET", "/api/v1/pods", (("impersonate_user", "x"),)))
    assert isinstance(refusal, Refusal)
    assert refusal.status == 403


def test_other_headers_with_an_underscore_pass_the_policy() -> None:
    request = head(("x_request_id", "abc"), ("x-real_ip", "10.0.0.1"))
    assert ProxyPolicy().check(request) is request


@pytest.mark.parametrize(
    "name",
    [
        "x-real-ip",
        "forwarded",
        "x-client-ip",
        "true-client-ip",
        "x-cluster-client-ip",
        "x-original-forwarded-for",
        "x-forwarded-for",
        "x-forwarded-host",
        "x-forwarded-port",
        "cf-connecting-ip",
        "x_real_ip",
        "x_forwarded_for",
        "true_client_ip",
        # Front-proxy identity headers: the policy refuses them spelled with "_".
        "x-remote-user",
        "x-remote-group",
    ],
)
def test_a_callers_word_on_its_address_never_reaches_the_api_server(name: str) -> None:
    sent = (("accept", "application/json"), (name, "10.0.0.1"))
    assert _forwarded((*ALICE, *sent)) == (*ALICE, ("accept", "application/json"))


def test_credentials_and_framing_in_disguise_never_reach_the_api_server() -> None:
    sent = (
        ("proxy_authorization", "Basic eA=="),
        ("transfer_encoding", "chunked"),
        ("content_length", "99"),
        ("content-length", "2"),
        ("x_request_id", "abc"),
    )
    assert _forwarded(sent) == (("content-length", "2"), ("x_request_id", "abc"))
