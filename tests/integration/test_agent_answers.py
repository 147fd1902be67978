"""What an agent's answer may not do to its caller: redirect, set cookies, unframe the connection.

The server trusts no agent with other clusters or with itself. Found in
review: an agent's ``Location`` reached kubectl unchanged, and kubectl follows
a redirect to the same host with the caller's token, so one agent could send
a user's DELETE to another cluster or to this server's own admin API. On the
path served by aiohttp, an interim answer or a ``Content-Length`` its body did
not keep also reached the caller as they were. Each test's agent answers with
bytes the test writes, as a compromised agent would.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from protocol import kinds
from protocol.http import RequestHead, encode_response_head
from tunnel_agent.router import StreamRouter
from tunnel_mux import MuxStream

from ..tunnel_server.frontdoor_support import PODS, Caller, Reply, caller, request
from .harness import RunningServer, agent_settings, running_agent

#: Served by aiohttp rather than the lean front door: a chunked request body.
CHUNKED = ("Transfer-Encoding: chunked",)


@dataclass
class Agent:
    """An agent whose every answer is ``answer``; the requests it got."""

    server: RunningServer
    token: str
    answer: bytes = b""
    requests: list[RequestHead] = field(default_factory=list)

    async def handle(self, stream: MuxStream) -> None:
        self.requests.append(RequestHead.from_open_headers(stream.headers))
        while await stream.read():
            pass
        await stream.write(self.answer)
        stream.end()

    async def ask(self, send: Callable[[Caller], None]) -> Reply:
        async with caller(self.server) as connection:
            send(connection)
            return await connection.reply()


@pytest.fixture
async def agent(server: RunningServer, tmp_path: Path) -> AsyncIterator[Agent]:
    bootstrap = await server.add_cluster("prod-eu")
    status, alice = await server.api("POST", "/api/v1/users", {"name": "alice", "groups": []})
    assert status == 201
    await server.api("PUT", "/api/v1/grants/alice/prod-eu", {})
    answering = Agent(server, alice["token"])
    router = StreamRouter()
    router.add(kinds.STREAM_HTTP, answering.handle)
    settings = agent_settings(server, "prod-eu", bootstrap, tmp_path / "creds")
    async with running_agent(settings, on_stream=router) as running:
        await running.wait_connected()
        yield answering


def get(agent: Agent) -> Callable[[Caller], None]:
    return lambda connection: connection.send(request("GET", PODS, agent.token))


def chunked_post(agent: Agent) -> Callable[[Caller], None]:
    sent = request("POST", PODS, agent.token, *CHUNKED) + b"2\r\n{}\r\n0\r\n\r\n"
    return lambda connection: connection.send(sent)


PATHS = {"lean": get, "aiohttp": chunked_post}


@pytest.mark.parametrize("path", PATHS)
async def test_a_location_on_the_api_server_stays_within_its_cluster(
    agent: Agent, path: str
) -> None:
    location = ("location", "/api/v1/namespaces/default/pods/demo?x=1")
    agent.answer = encode_response_head(
        307, "Temporary Redirect", [location, ("content-length", "0")]
    )
    reply = await agent.ask(PATHS[path](agent))
    assert reply.status == 307
    assert (
        reply.header("location") == "/k8s/clusters/prod-eu/api/v1/namespaces/default/pods/demo?x=1"
    )


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "location",
    [
        "/k8s/../api/v1/clusters/prod",  # this server's admin API, dotted
        "//tunnel.example.com/api/v1/clusters/prod",  # another host, scheme-relative
        "https://127.0.0.1:8443/k8s/clusters/other/api/v1/pods",  # another cluster
        "/api/v1/namespaces/default%2Fsecrets",  # encoded
    ],
)
async def test_any_other_location_and_every_cookie_are_dropped(
    agent: Agent, path: str, location: str
) -> None:
    headers = [("location", location), ("set-cookie", "session=agent"), ("content-length", "0")]
    agent.answer = encode_response_head(302, "Found", headers)
    reply = await agent.ask(PATHS[path](agent))
    assert reply.status == 302
    assert reply.header("location") is None
    assert reply.header("set-cookie") is None


async def test_a_callers_cookie_never_reaches_the_agent(agent: Agent) -> None:
    agent.answer = encode_response_head(200, "OK", [("content-length", "0")])
    send = request("GET", PODS, agent.token, "Cookie: session=caller-secret")
    reply = await agent.ask(lambda connection: connection.send(send))
    assert reply.status == 200
    [got] = agent.requests
    assert all(name != "cookie" for name, _ in got.headers)


@pytest.mark.parametrize("status", [103, 101])
async def test_an_answer_not_asked_for_on_the_aiohttp_path_is_refused(
    agent: Agent, status: int
) -> None:
    injected = b"HTTP/1.1 200 OK\r\nSet-Cookie: pwn=1\r\nContent-Length: 0\r\n\r\n"
    agent.answer = encode_response_head(status, "Early", []) + injected
    reply = await agent.ask(chunked_post(agent))
    assert reply.status == 502
    assert f"the agent answered {status}, which was not asked for" in reply.json()["message"]


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize(
    ("length", "body", "why"),
    [
        (2, b'{"kind":"PodList"}', "the agent sent more than its Content-Length"),
        (64, b'{"kind":"PodList"}', "the agent's answer ended short of its Content-Length"),
    ],
)
async def test_a_body_that_breaks_its_length_ends_the_callers_connection_on_both_paths(
    agent: Agent, path: str, length: int, body: bytes, why: str
) -> None:
    """One standard: the caller sees the break, never a whole answer of another length."""
    agent.answer = encode_response_head(200, "OK", [("content-length", str(length))]) + body
    async with caller(agent.server) as connection:
        PATHS[path](agent)(connection)
        head = await connection.reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ")
        rest = await connection.reader.read()  # to the end of the connection: it is cut
    # Neither the whole body with its last chunk, nor a body of the stated length.
    assert not rest.endswith(b"0\r\n\r\n")
    assert len(rest) < length
    status, events = await agent.server.api("GET", "/api/v1/audit?kind=proxy&limit=1")
    assert status == 200
    assert why in events[0]["detail"]["ended"]


@pytest.mark.parametrize("path", sorted(PATHS))
async def test_an_answer_with_both_transfer_encoding_and_length_is_refused_on_both_paths(
    agent: Agent, path: str
) -> None:
    headers = [("transfer-encoding", "chunked"), ("content-length", "2")]
    agent.answer = encode_response_head(200, "OK", headers) + b"{}"
    reply = await agent.ask(PATHS[path](agent))
    assert reply.status == 502
    assert "both Transfer-Encoding and Content-Length" in reply.json()["message"]


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("reason", ["OK\r\nSet-Cookie: pwn=1", "OK\nX: y", "\x00"])
async def test_a_reason_phrase_that_would_split_the_status_line_is_replaced_on_both_paths(
    agent: Agent, path: str, reason: str
) -> None:
    agent.answer = encode_response_head(200, reason, [("content-length", "2")]) + b"{}"
    reply = await agent.ask(PATHS[path](agent))
    assert (reply.status, reply.reason, reply.body) == (200, "OK", b"{}")
    assert reply.header("set-cookie") is None
