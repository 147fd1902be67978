"""Identity-shaped headers, through a real server and agent: a caller's word on its address
never reaches the API server, and an identity header in disguise is refused.

Found in an outside review: ``X-Real-Ip`` (which kube-apiserver writes into its
audit events' source addresses, so a caller could plant an address there),
``Forwarded``, ``X-Client-Ip`` and ``True-Client-Ip`` reached the API server;
``Impersonate_User`` and ``X_Remote_User`` passed both the server's and the
agent's checks, and a proxy in front of an API server that reads "_" as "-"
would honour them. Each side holds on its own: the server drops or refuses
them, and so does the agent given them by a server that did not.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from protocol import kinds
from protocol.http import RequestHead
from tunnel_agent.policy import ProxyPolicy
from tunnel_mux import MuxStream

from ..tunnel_server.frontdoor_support import PODS, Reply, assert_status_object, caller, request
from .harness import RunningServer
from .test_body_framing import answer_head
from .test_kubeproxy_relay import Tunnel, running_tunnel

#: Headers that claim the caller's address, each in a spelling the API server (or a
#: proxy in front of it) would read as one.
CLIENT_ADDRESS = (
    "X-Real-Ip: 203.0.113.7",
    "Forwarded: for=203.0.113.7",
    "X-Client-Ip: 203.0.113.7",
    "True-Client-Ip: 203.0.113.7",
    "X-Cluster-Client-Ip: 203.0.113.7",
    "X-Original-Forwarded-For: 203.0.113.7",
    "X-Forwarded-For: 203.0.113.7",
    "X_Real_Ip: 203.0.113.7",
)
#: What an API server's audit log or a proxy would take as an address, a host or a scheme.
ADDRESS_NAMES = {
    "x-real-ip",
    "x_real_ip",
    "forwarded",
    "x-client-ip",
    "true-client-ip",
    "x-cluster-client-ip",
    "x-original-forwarded-for",
    "x-forwarded-for",
}


@pytest.fixture
async def tunnel(server: RunningServer, tmp_path: Path) -> AsyncIterator[Tunnel]:
    """prod-eu behind an agent that allows writes, alice granted it; the upstream records."""
    async with running_tunnel(server, tmp_path, ProxyPolicy(), {"name": "alice"}, {}) as running:
        yield running


def lean(token: str, *headers: str) -> bytes:
    """A plain GET: served by the lean front door."""
    return request("GET", PODS, token, *headers)


def chunked_post(token: str, *headers: str) -> bytes:
    """A POST with a chunked body: served by aiohttp's route."""
    sent = request("POST", PODS, token, "Transfer-Encoding: chunked", *headers)
    return sent + b"2\r\n{}\r\n0\r\n\r\n"


PATHS: dict[str, Callable[..., bytes]] = {"lean": lean, "aiohttp": chunked_post}


async def ask(tunnel: Tunnel, sent: bytes) -> Reply:
    async with caller(tunnel.server) as connection:
        connection.send(sent)
        return await connection.reply()


async def open_on_agent(tunnel: Tunnel, head: RequestHead) -> MuxStream:
    """A stream opened on the agent's session as a server would, unchecked by it."""
    registered = tunnel.server.context.registry.get("prod-eu")
    assert registered is not None
    stream = registered.session.open_stream(
        kinds.STREAM_HTTP, head.to_open_headers(), end_stream=True
    )
    await registered.session.send_if_due()
    return stream


@pytest.mark.parametrize("path", sorted(PATHS))
async def test_a_callers_word_on_its_address_never_reaches_the_api_server(
    tunnel: Tunnel, path: str
) -> None:
    reply = await ask(tunnel, PATHS[path](tunnel.token, *CLIENT_ADDRESS, "X-Note: kept"))
    assert reply.status == 200, reply.body
    [(_, _, headers)] = tunnel.upstream.requests
    names = {name.lower() for name in headers}
    assert names & ADDRESS_NAMES == set()
    assert "203.0.113.7" not in str(list(headers.items()))
    assert headers["X-Note"] == "kept"
    assert headers["Impersonate-User"] == "tunnel:alice"


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize(
    ("header", "folded"),
    [
        ("Impersonate_User", "impersonate-user"),
        ("Impersonate_Group", "impersonate-group"),
        ("X_Remote_User", "x-remote-user"),
    ],
)
async def test_an_identity_header_spelled_with_an_underscore_is_refused(
    tunnel: Tunnel, path: str, header: str, folded: str
) -> None:
    reply = await ask(tunnel, PATHS[path](tunnel.token, f"{header}: system:masters"))
    assert_status_object(reply, 403, "Forbidden")
    assert reply.json()["message"].startswith(
        f"the {header.lower()} header is refused (a proxy that reads '_' as '-' would take it "
        f"for {folded}): "
    )
    assert tunnel.upstream.requests == []


@pytest.mark.parametrize("path", sorted(PATHS))
async def test_a_front_proxy_identity_header_is_refused(tunnel: Tunnel, path: str) -> None:
    reply = await ask(tunnel, PATHS[path](tunnel.token, "X-Remote-User: system:admin"))
    assert_status_object(reply, 403, "Forbidden")
    assert reply.json()["message"].startswith("the x-remote-user header is refused: ")
    assert tunnel.upstream.requests == []


IDENTITY = (("impersonate-user", "tunnel:alice"),)


@pytest.mark.parametrize("header", ["impersonate_user", "impersonate_group", "x_remote_user"])
async def test_the_agent_refuses_an_identity_header_in_disguise_whatever_the_server_sent(
    tunnel: Tunnel, header: str
) -> None:
    sent = (*IDENTITY, (header, "system:masters"))
    head = RequestHead("GET", "/api/v1/namespaces/default/pods", sent, False)
    answer, body = await answer_head(await open_on_agent(tunnel, head))
    assert answer.status == 403, body
    assert f"the {header} header is not allowed".encode() in body
    assert tunnel.upstream.requests == []


# GET goes through the agent's own client, HEAD through aiohttp's.
@pytest.mark.parametrize("method", ["GET", "HEAD"])
async def test_the_agent_drops_a_client_address_whatever_the_server_sent(
    tunnel: Tunnel, method: str
) -> None:
    address = [(name, "203.0.113.7") for name in sorted(ADDRESS_NAMES)]
    sent = (*IDENTITY, *address, ("x-note", "kept"))
    head = RequestHead(method, "/api/v1/namespaces/default/pods", sent, False)
    answer, body = await answer_head(await open_on_agent(tunnel, head))
    assert answer.status == 200, body
    [(seen_method, _, headers)] = tunnel.upstream.requests
    assert seen_method == method
    assert {name.lower() for name in headers} & ADDRESS_NAMES == set()
    assert headers["X-Note"] == "kept"
