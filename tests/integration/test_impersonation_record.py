"""Who the cluster was told a caller is goes on the record, and a grant can limit it.

Found in review: a user with an ``--impersonate`` grant reached the API server
as exactly ``tunnel:alice`` in ``tunnel:platform`` (the identity alice's own
requests carry), and the server's audit event said only "carol, list, path",
while the cluster's audit log showed alice. Now every proxied request's audit
event holds the identity and groups sent (``detail.as``, marked
``impersonated`` when the caller chose them), and a grant may name whom its
user may impersonate.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from protocol import kinds
from protocol.http import encode_response_head
from tunnel_agent.router import StreamRouter

from ..tunnel_server.frontdoor_support import PODS, Caller, request
from .harness import RunningServer, agent_settings, running_agent
from .test_agent_answers import CHUNKED, Agent

OK = encode_response_head(200, "OK", [("content-length", "2")]) + b"{}"


async def add_user(server: RunningServer, name: str, groups: list[str]) -> str:
    status, answer = await server.api("POST", "/api/v1/users", {"name": name, "groups": groups})
    assert status == 201, answer
    token: str = answer["token"]
    return token


async def grant(server: RunningServer, user: str, body: dict[str, Any]) -> None:
    status, answer = await server.api("PUT", f"/api/v1/grants/{user}/prod-eu", body)
    assert status == 200, answer


@pytest.fixture
async def agent(server: RunningServer, tmp_path: Path) -> AsyncIterator[Agent]:
    """Cluster prod-eu with an agent answering 200; alice in platform, carol in ops."""
    bootstrap = await server.add_cluster("prod-eu")
    alice = await add_user(server, "alice", ["platform"])
    await grant(server, "alice", {"as_groups": ["viewers"]})
    answering = Agent(server, alice, OK)
    router = StreamRouter()
    router.add(kinds.STREAM_HTTP, answering.handle)
    settings = agent_settings(server, "prod-eu", bootstrap, tmp_path / "creds")
    async with running_agent(settings, on_stream=router) as running:
        await running.wait_connected()
        yield answering


async def last_event(server: RunningServer, user: str) -> dict[str, Any]:
    status, events = await server.api("GET", f"/api/v1/audit?kind=proxy&user={user}&limit=1")
    assert status == 200, events
    [event] = events
    assert isinstance(event, dict)
    return event


def lean(token: str, *headers: str) -> Callable[[Caller], None]:
    return lambda connection: connection.send(request("GET", PODS, token, *headers))


def aiohttp(token: str, *headers: str) -> Callable[[Caller], None]:
    sent = request("POST", PODS, token, *CHUNKED, *headers) + b"2\r\n{}\r\n0\r\n\r\n"
    return lambda connection: connection.send(sent)


PATHS = {"lean": lean, "aiohttp": aiohttp}


@pytest.mark.parametrize("path", sorted(PATHS))
async def test_every_proxied_request_records_the_identity_sent(agent: Agent, path: str) -> None:
    reply = await agent.ask(PATHS[path](agent.token))
    assert reply.status == 200
    event = await last_event(agent.server, "alice")
    assert event["detail"]["as"] == {
        "user": "tunnel:alice",
        "groups": ["tunnel:platform", "tunnel:viewers"],
        "impersonated": False,
    }


@pytest.mark.parametrize("path", sorted(PATHS))
async def test_an_impersonating_request_records_whom_it_became(agent: Agent, path: str) -> None:
    carol = await add_user(agent.server, "carol", ["ops"])
    await grant(agent.server, "carol", {"impersonate": True})
    send = PATHS[path](carol, "Impersonate-User: alice", "Impersonate-Group: platform")
    reply = await agent.ask(send)
    assert reply.status == 200
    [sent] = agent.requests
    assert ("impersonate-user", "tunnel:alice") in sent.headers
    event = await last_event(agent.server, "carol")
    assert event["user"] == "carol"
    assert event["detail"]["as"] == {
        "user": "tunnel:alice",
        "groups": ["tunnel:platform"],
        "impersonated": True,
    }


async def test_a_refusal_before_the_identity_is_decided_records_none(agent: Agent) -> None:
    carol = await add_user(agent.server, "carol", ["ops"])  # no grant on prod-eu
    reply = await agent.ask(lean(carol))
    assert reply.status == 403
    event = await last_event(agent.server, "carol")
    assert "as" not in event["detail"]
    assert agent.requests == []


async def test_a_grant_naming_users_allows_those_and_refuses_others(agent: Agent) -> None:
    carol = await add_user(agent.server, "carol", ["ops"])
    await grant(
        agent.server, "carol", {"impersonate": True, "impersonate_targets": ["alice", "group:ops"]}
    )
    allowed = await agent.ask(lean(carol, "Impersonate-User: alice", "Impersonate-Group: ops"))
    assert allowed.status == 200
    other_user = await agent.ask(lean(carol, "Impersonate-User: bob"))
    assert other_user.status == 403
    assert "may not impersonate bob" in other_user.json()["message"]
    assert "alice, group:ops" in other_user.json()["message"]
    other_group = await agent.ask(
        lean(carol, "Impersonate-User: alice", "Impersonate-Group: platform")
    )
    assert other_group.status == 403
    assert "may not impersonate group platform" in other_group.json()["message"]
    assert len(agent.requests) == 1  # only the allowed one reached the cluster


async def test_a_grant_naming_groups_only_lets_the_user_add_them_to_its_own_name(
    agent: Agent,
) -> None:
    carol = await add_user(agent.server, "carol", ["ops"])
    await grant(agent.server, "carol", {"impersonate": True, "impersonate_targets": ["group:sre"]})
    as_herself = await agent.ask(lean(carol, "Impersonate-User: carol", "Impersonate-Group: sre"))
    assert as_herself.status == 200
    as_alice = await agent.ask(lean(carol, "Impersonate-User: alice", "Impersonate-Group: sre"))
    assert as_alice.status == 403
    assert "may not impersonate alice" in as_alice.json()["message"]


async def test_the_grant_says_whom_its_user_may_impersonate(
    agent: Agent,
) -> None:
    """The grant's view says whom; the bare flag is anyone (an empty list)."""
    carol = await add_user(agent.server, "carol", ["ops"])
    await grant(agent.server, "carol", {"impersonate": True})
    status, grants = await agent.server.api("GET", "/api/v1/grants?user=carol")
    assert status == 200
    assert grants[0]["impersonate_targets"] == []
    await grant(agent.server, "carol", {"impersonate": True, "impersonate_targets": ["alice"]})
    status, grants = await agent.server.api("GET", "/api/v1/grants?user=carol")
    assert grants[0]["impersonate_targets"] == ["alice"]
    reply = await agent.ask(lean(carol, "Impersonate-User: bob"))
    assert reply.status == 403


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"impersonate_targets": ["alice"]}, "impersonate_targets need impersonate: true"),
        ({"impersonate": True, "impersonate_targets": ["system-masters"]}, "not allowed"),
        ({"impersonate": True, "impersonate_targets": ["group:system"]}, "not allowed"),
        ({"impersonate": True, "impersonate_targets": ["Alice"]}, "not allowed"),
        ({"impersonate": True, "impersonate_targets": "alice"}, "must be a list"),
        ({"impersonate": True, "impersonate_targets": ["alice\n"]}, "not allowed"),
    ],
)
async def test_a_grant_with_targets_that_cannot_be_is_refused(
    agent: Agent, body: dict[str, Any], message: str
) -> None:
    await add_user(agent.server, "carol", ["ops"])
    status, answer = await agent.server.api("PUT", "/api/v1/grants/carol/prod-eu", body)
    assert status == 400
    assert message in answer["error"]["message"]
