"""The caller's headers the server passes on: no word on its address, no identity in disguise.

Found in an outside review: ``X-Real-Ip`` (which kube-apiserver writes into
its audit events' source addresses), ``Forwarded``, ``X-Client-Ip`` and
``True-Client-Ip`` went on to the agent; and ``Impersonate_User`` or
``X_Remote_User``, which a proxy in front of an API server that reads "_" as
"-" would honour, passed as any other header. The agent's own checks are in
tests/tunnel_agent/test_identity_headers.py; both through the tunnel, in
tests/integration/test_identity_headers.py.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tunnel_server.proxy.identity import forwarded_headers
from tunnel_server.proxy.refusal import ProxyRefusal
from tunnel_server.store.base import Grant, User

ALICE = User("alice", ("platform",), False, datetime(2024, 1, 1, tzinfo=UTC))
GRANT = Grant("alice", "prod-eu")
#: A grant that lets alice use kubectl --as: a disguised header is refused all the same.
IMPERSONATE = Grant("alice", "prod-eu", impersonate=True)
OURS = [("impersonate-user", "tunnel:alice"), ("impersonate-group", "tunnel:platform")]

#: Headers that claim a client's address (or host, or scheme), each dropped.
CLIENT_ADDRESS = [
    "x-real-ip",
    "forwarded",
    "x-client-ip",
    "true-client-ip",
    "x-cluster-client-ip",
    "x-original-forwarded-for",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-forwarded-port",
    "cf-connecting-ip",
    # Spelled with "_": X-Real-Ip to a proxy that reads "_" as "-".
    "x_real_ip",
    "x_forwarded_for",
    "true_client_ip",
]


def forward(*headers: tuple[str, str], grant: Grant = GRANT) -> list[tuple[str, str]]:
    return forwarded_headers(headers, None, ALICE, grant)


@pytest.mark.parametrize("name", CLIENT_ADDRESS)
def test_a_callers_word_on_its_address_never_goes_on(name: str) -> None:
    forwarded = forward(("accept", "application/json"), (name, "10.0.0.1"))
    assert forwarded == [("accept", "application/json"), *OURS]


def test_other_headers_go_on_as_they_came() -> None:
    sent = [
        ("accept", "application/json"),
        ("user-agent", "kubectl/v1.31.0"),
        ("x-request_id", "abc"),
        ("content-length", "2"),
    ]
    assert forward(*sent) == [*sent, *OURS]


def test_credentials_and_framing_in_disguise_are_dropped() -> None:
    sent = [
        ("proxy_authorization", "Basic eA=="),
        ("transfer_encoding", "chunked"),
        ("content_length", "99"),
        ("content-length", "2"),
    ]
    assert forward(*sent) == [("content-length", "2"), *OURS]


@pytest.mark.parametrize("grant", [GRANT, IMPERSONATE], ids=["plain", "impersonate"])
@pytest.mark.parametrize(
    ("name", "folded"),
    [
        ("impersonate_user", "impersonate-user"),
        ("impersonate_group", "impersonate-group"),
        ("impersonate-extra_scopes", None),  # an Impersonate-* header: refused as before
        ("impersonate_extra_scopes", "impersonate-extra-scopes"),
        ("x_remote_user", "x-remote-user"),
        ("x-remote_group", "x-remote-group"),
    ],
)
def test_an_identity_header_spelled_with_an_underscore_is_refused(
    grant: Grant, name: str, folded: str | None
) -> None:
    with pytest.raises(ProxyRefusal) as refused:
        forward(("accept", "*/*"), (name, "system:admin"), grant=grant)
    assert (refused.value.code, refused.value.reason) == (403, "Forbidden")
    if folded is not None:
        assert refused.value.message.startswith(
            f"the {name} header is refused (a proxy that reads '_' as '-' would take it "
            f"for {folded}): "
        )


@pytest.mark.parametrize("name", ["x-remote-user", "x-remote-group", "x-remote-extra-scopes"])
def test_a_front_proxy_identity_header_is_refused(name: str) -> None:
    with pytest.raises(ProxyRefusal) as refused:
        forward((name, "system:admin"))
    assert (refused.value.code, refused.value.reason) == (403, "Forbidden")
    assert refused.value.message == (
        f"the {name} header is refused: X-Remote-* headers name an identity to an API server "
        "behind an authenticating proxy; the cluster learns who the caller is from this "
        "server alone"
    )


def test_the_refusal_quotes_a_long_name_cut_short() -> None:
    name = "impersonate_" + "x" * 500
    with pytest.raises(ProxyRefusal) as refused:
        forward((name, "v"))
    assert len(refused.value.message) < 300


def test_a_callers_own_impersonation_still_passes_with_an_impersonate_grant() -> None:
    forwarded = forward(("impersonate-user", "bob"), ("x-real-ip", "10.0.0.1"), grant=IMPERSONATE)
    assert forwarded == [("impersonate-user", "tunnel:bob")]


def test_an_upgrade_goes_without_a_length_in_any_spelling() -> None:
    sent = [("content-length", "0"), ("content_length", "0"), ("x-real-ip", "10.0.0.1")]
    forwarded = forwarded_headers(sent, "websocket", ALICE, GRANT)
    assert forwarded == [("connection", "Upgrade"), ("upgrade", "websocket"), *OURS]
