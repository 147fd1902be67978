"""Bodies where none may go, end to end: upgrades and HEAD requests.

The agent relays upgrades and HEAD requests through aiohttp's client. Had one
of them announced a body that never came (or came short), the API server
would take the next request on that connection, another caller's, as the rest
of it, and what followed as a request that neither the server nor the agent
checked, run with the agent's credentials. Each test's upstream records every
request it parses, on which connection; it reads an announced body before it
answers, as Go's net/http does.
"""

from __future__ import annotations

import gzip
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes_asyncio import client as kube_client

from protocol import kinds
from protocol.http import RequestHead, ResponseHead, ResponseHeadParser
from tunnel_agent.kubeapi import KubeApi
from tunnel_agent.kubeproxy import KubeProxy
from tunnel_agent.policy import ProxyPolicy
from tunnel_agent.router import StreamRouter
from tunnel_mux import MuxStream

from ..tunnel_agent.upstream_origin import Exchange, Origin, response_bytes, running
from ..tunnel_server.frontdoor_support import PODS, caller, request
from .harness import RunningServer, agent_settings, running_agent

EXEC = "/api/v1/namespaces/default/pods/demo/exec?command=sh&stdin=true&stdout=true"
UPGRADE = ("Connection: Upgrade", "Upgrade: websocket")
#: What the server adds to every request it relays; the agent refuses one without it.
IDENTITY = (("impersonate-user", "tunnel:alice"),)


@dataclass
class Framed:
    server: RunningServer
    origin: Origin
    token: str

    def seen(self) -> list[tuple[str, str]]:
        """The requests the upstream parsed: method and target."""
        return [(exchange.method, exchange.target) for exchange in self.origin.exchanges]

    async def open(self, head: RequestHead, *, end_stream: bool) -> MuxStream:
        """A stream opened on the agent's session as the server would, unchecked."""
        registered = self.server.context.registry.get("prod-eu")
        assert registered is not None
        stream = registered.session.open_stream(
            kinds.STREAM_HTTP, head.to_open_headers(), end_stream=end_stream
        )
        await registered.session.send_if_due()
        return stream


async def answer(exchange: Exchange) -> None:
    """As the API server: an upgrade refused by RBAC, a HEAD with its length only."""
    if exchange.header("upgrade") is not None:
        exchange.write(response_bytes(b'{"kind":"Status"}', status="403 Forbidden"))
    elif exchange.method == "HEAD":
        exchange.write(b"HTTP/1.1 200 OK\r\nContent-Length: 17\r\n\r\n")
    else:
        exchange.write(response_bytes(exchange.body))


@pytest.fixture
async def framed(
    server: RunningServer, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Framed]:
    """The tunnel to the recording upstream; read-only unless a test gives its policy."""
    bootstrap = await server.add_cluster("prod-eu")
    status, alice = await server.api("POST", "/api/v1/users", {"name": "alice", "groups": []})
    assert status == 201
    await server.api("PUT", "/api/v1/grants/alice/prod-eu", {})
    async with running(answer) as origin:
        configuration = kube_client.Configuration(host=origin.url)
        configuration.api_key["BearerToken"] = "Bearer agent-service-account-token"
        api = KubeApi(configuration)
        proxy = KubeProxy(api, getattr(request, "param", ProxyPolicy(read_only=True)))
        router = StreamRouter()
        router.add(kinds.STREAM_HTTP, proxy.handle)
        settings = agent_settings(server, "prod-eu", bootstrap, tmp_path / "creds")
        try:
            async with running_agent(settings, on_stream=router) as agent:
                await agent.wait_connected()
                yield Framed(server, origin, alice["token"])
        finally:
            await proxy.close()
            await api.close()


async def answer_head(stream: MuxStream) -> tuple[ResponseHead, bytes]:
    """The head of the agent's answer on ``stream``, and the whole body after it."""
    parser = ResponseHeadParser()
    body = b""
    while parser.head is None:
        chunk = await stream.read()
        assert chunk, "the agent ended the stream without answering"
        body = parser.feed(chunk)
    while chunk := await stream.read():
        body += chunk
    return parser.head, body


async def test_an_upgrade_announcing_a_body_is_refused_and_smuggles_nothing(
    framed: Framed,
) -> None:
    # A relay that sent caller 1's head alone would leave the API server
    # reading the start of the next request on that connection (caller 2's)
    # as its body: with the length chosen to match, caller 2's header would be
    # read as a DELETE that this read-only agent never saw.
    smuggled = "X-S: DELETE /api/v1/namespaces/prod/pods/db-0 HTTP/1.1"
    exec_target = f"/k8s/clusters/prod-eu{EXEC}"
    async with caller(framed.server) as first, caller(framed.server) as second:
        first.send(request("GET", exec_target, framed.token, *UPGRADE, body=b"x" * 80))
        refused = await first.reply()
        second.send(request("HEAD", PODS, framed.token, smuggled))
        answered = await second.reply(head=True)
    assert refused.status == 400
    assert (
        "an upgrade request (exec, attach, port-forward) cannot carry a body"
        in (refused.json()["message"])
    )
    assert answered.status == 200
    assert framed.seen() == [("HEAD", "/api/v1/namespaces/default/pods")]


async def test_the_server_refuses_a_head_request_with_a_body(framed: Framed) -> None:
    async with caller(framed.server) as connection:
        connection.send(request("HEAD", PODS, framed.token, body=b"hello"))
        with_length = await connection.reply(head=True)
    async with caller(framed.server) as connection:
        # Chunked: served by aiohttp rather than the lean front door.
        chunked = ("Transfer-Encoding: chunked",)
        connection.send(request("HEAD", PODS, framed.token, *chunked) + b"5\r\nhello\r\n0\r\n\r\n")
        with_chunks = await connection.reply(head=True)
    assert (with_length.status, with_chunks.status) == (400, 400)
    assert framed.seen() == []


async def test_the_agent_refuses_an_upgrade_announcing_a_body_whatever_the_server_sent(
    framed: Framed,
) -> None:
    # The cluster's owner trusts the agent, not the server: a server that
    # relays such a request gets the refusal from the agent. (A watch over a
    # WebSocket: an upgrade that the read-only agent allows.)
    watch = "/api/v1/namespaces/default/pods?watch=true"
    head = RequestHead("GET", watch, (*IDENTITY, ("content-length", "80")), True)
    stream = await framed.open(head, end_stream=False)
    answer_to, body = await answer_head(stream)
    assert answer_to.status == 400, body
    assert b"an upgrade request (exec, attach, port-forward) cannot carry a body" in body
    assert framed.seen() == []


@pytest.mark.parametrize("framed", [ProxyPolicy()], indirect=True)
async def test_no_credential_or_front_proxy_identity_header_reaches_the_api_server(
    framed: Framed,
) -> None:
    sent = [
        ("authorization", "Bearer the-servers-choice"),
        ("cookie", "session=1"),
        ("x-remote-user", "system:admin"),
        ("x-remote-group", "system:masters"),
        ("x-remote-extra-scopes", "all"),
        ("accept", "application/json"),
    ]
    head = RequestHead("GET", "/api/v1/namespaces/default/pods", (*IDENTITY, *sent), False)
    answer_to, _ = await answer_head(await framed.open(head, end_stream=True))
    assert answer_to.status == 200
    [exchange] = framed.origin.exchanges
    names = [name.lower() for name, _ in exchange.headers]
    assert "cookie" not in names
    assert not [name for name in names if name.startswith("x-remote-")]
    assert exchange.header("authorization") == "Bearer agent-service-account-token"
    assert exchange.header("accept") == "application/json"


@pytest.mark.parametrize(
    ("upgrade", "header"),
    [(False, "x-note"), (True, "x-note"), (True, "upgrade")],
)
async def test_the_agent_answers_400_to_a_control_character_in_a_header_on_any_path(
    framed: Framed, upgrade: bool, header: str
) -> None:
    # HEAD and upgrades go through aiohttp, which raised a bare ValueError:
    # the stream was reset unanswered, with a traceback in the agent's log.
    # The Upgrade value is the caller's too: the agent copies it.
    method = "GET" if upgrade else "HEAD"
    watch = "/api/v1/namespaces/default/pods?watch=1"
    head = RequestHead(method, watch, (*IDENTITY, (header, "websocket\x01")), upgrade)
    stream = await framed.open(head, end_stream=True)
    answer_to, body = await answer_head(stream)
    assert answer_to.status == 400, body
    assert f"the value of the {header} header holds a control character".encode() in body
    assert framed.seen() == []


async def test_the_agent_refuses_a_head_request_with_a_body_whatever_the_server_sent(
    framed: Framed,
) -> None:
    head = RequestHead("HEAD", "/api/v1/pods", IDENTITY, False)
    stream = await framed.open(head, end_stream=False)
    await stream.write(b"hello")
    stream.end()
    answer_to, body = await answer_head(stream)
    assert answer_to.status == 400, body
    assert b"a HEAD request cannot carry a body" in body
    assert framed.seen() == []


@pytest.mark.parametrize("framed", [ProxyPolicy()], indirect=True)
async def test_each_upgrade_and_head_request_has_a_connection_of_its_own(framed: Framed) -> None:
    async with caller(framed.server) as connection:
        connection.send(request("GET", f"/k8s/clusters/prod-eu{EXEC}", framed.token, *UPGRADE))
        refused_upgrade = await connection.reply()
    async with caller(framed.server) as connection:
        for _ in range(2):
            connection.send(request("HEAD", PODS, framed.token))
            assert (await connection.reply(head=True)).status == 200
    assert refused_upgrade.status == 403
    assert [exchange.method for exchange in framed.origin.exchanges] == ["GET", "HEAD", "HEAD"]
    # No connection of these serves a second request.
    assert [exchange.peer.number for exchange in framed.origin.exchanges] == [0, 1, 2]
    # An upgrade goes without a length, the more so one the caller gave.
    assert framed.origin.exchanges[0].header("content-length") is None


@pytest.mark.parametrize("framed", [ProxyPolicy()], indirect=True)
@pytest.mark.parametrize("framing", ["Transfer-Encoding: chunked", "Expect: 100-continue"])
async def test_a_compressed_body_reaches_the_api_server_as_it_came(
    framed: Framed, framing: str
) -> None:
    # Both framings are served by aiohttp, which decodes a body unless told not to.
    compressed = gzip.compress(b'{"kind":"Pod"}')
    headers = (framing, "Content-Encoding: gzip")
    if framing.startswith("Transfer-Encoding"):
        chunks = b"%x\r\n%s\r\n0\r\n\r\n" % (len(compressed), compressed)
        sent = request("POST", PODS, framed.token, *headers) + chunks
    else:
        sent = request("POST", PODS, framed.token, *headers, body=compressed)
    async with caller(framed.server) as connection:
        connection.send(sent)
        while (reply := await connection.reply()).status == 100:
            pass
    assert reply.status == 200
    (exchange,) = framed.origin.exchanges
    assert exchange.header("content-encoding") == "gzip"
    assert exchange.body == compressed
