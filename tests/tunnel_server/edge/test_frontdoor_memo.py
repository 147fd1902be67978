"""A caller connection's remembered decision: reused only while nothing it rests on changed.

The front door remembers, per connection, the user and the forwarded headers
it decided for the last request's header lines. These tests use the real
server, agent and API stand-in (the e2e ``tunnel`` fixture) over real TLS,
and check both that the decision is reused and that it never outlives a
revocation: through the API, in the store behind the server's back (once
the access cache's answers expire), or by other header lines.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.e2e import test_kubectl_tunnel as kubectl_e2e
from tests.e2e.test_kubectl_tunnel import Tunnel
from tunnel_server.access.cache import AccessCache
from tunnel_server.store.base import User

from ...support import ManualClock, until
from ..frontdoor_support import PODS, assert_status_object, caller, get, request

server = kubectl_e2e.server
tunnel = kubectl_e2e.tunnel


def count_token_lookups(tunnel: Tunnel, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record each time the server looks up who a token is (by the token's hash)."""
    access = tunnel.server.context.access
    lookup = access.lookup_user_by_hash
    seen: list[str] = []

    async def counted(token_hash: str) -> tuple[float, User | None]:
        seen.append(token_hash)
        return await lookup(token_hash)

    monkeypatch.setattr(access, "lookup_user_by_hash", counted)
    return seen


async def test_repeated_requests_on_a_connection_reuse_the_decision_and_its_identity(
    tunnel: Tunnel, monkeypatch: pytest.MonkeyPatch
) -> None:
    lookups = count_token_lookups(tunnel, monkeypatch)
    async with caller(tunnel.server) as connection:
        for _ in range(3):
            connection.send(get(tunnel, f"{PODS}/demo"))
            assert (await connection.reply()).status == 200
    assert len(lookups) == 1
    seen = [e for e in tunnel.stub.requests if e.path.endswith("/pods/demo")]
    assert len(seen) == 3
    for entry in seen:
        assert entry.header("Impersonate-User") == "tunnel:alice"
        assert entry.header_values("Impersonate-Group") == ["tunnel:platform"]
        assert entry.header("Authorization") == f"Bearer {tunnel.stub.token}"


@pytest.mark.parametrize(
    ("change", "code", "reason"),
    [
        ("/api/v1/grants/alice/prod-eu", 403, "Forbidden"),  # the grant deleted
        ("/api/v1/users/alice/tokens", 401, "Unauthorized"),  # the tokens revoked
        ("/api/v1/clusters/prod-eu", 403, "Forbidden"),  # the cluster, its grants with it
    ],
)
async def test_a_change_through_the_api_refuses_the_next_request_on_the_connection(
    tunnel: Tunnel, change: str, code: int, reason: str
) -> None:
    async with caller(tunnel.server) as connection:
        connection.send(get(tunnel, f"{PODS}/demo"))
        assert (await connection.reply()).status == 200
        status, _ = await tunnel.server.api("DELETE", change)
        assert status in (200, 204)
        connection.send(get(tunnel, f"{PODS}/demo"))
        assert_status_object(await connection.reply(), code, reason)


async def test_a_grant_deleted_behind_the_servers_back_is_seen_once_the_cache_expires(
    tunnel: Tunnel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another replica changed the store: nothing invalidates this server's
    # caches. With answers that expire at once, the next request must see it.
    context = tunnel.server.context
    monkeypatch.setattr(context, "access", AccessCache(context.store, ttl=0.0))
    async with caller(tunnel.server) as connection:
        connection.send(get(tunnel, f"{PODS}/demo"))
        assert (await connection.reply()).status == 200
        await context.store.delete_grant("alice", "prod-eu")
        connection.send(get(tunnel, f"{PODS}/demo"))
        assert_status_object(await connection.reply(), 403, "Forbidden")


async def test_another_token_on_the_same_connection_is_checked_afresh(tunnel: Tunnel) -> None:
    async with caller(tunnel.server) as connection:
        connection.send(get(tunnel, f"{PODS}/demo"))
        assert (await connection.reply()).status == 200
        connection.send(request("GET", f"{PODS}/demo", "not-a-token"))
        assert_status_object(await connection.reply(), 401, "Unauthorized")


async def test_another_cluster_on_the_same_connection_is_checked_afresh(tunnel: Tunnel) -> None:
    await tunnel.server.add_cluster("staging")
    async with caller(tunnel.server) as connection:
        connection.send(get(tunnel, f"{PODS}/demo"))
        assert (await connection.reply()).status == 200
        connection.send(get(tunnel, "/k8s/clusters/staging/api/v1/namespaces"))
        assert_status_object(await connection.reply(), 403, "Forbidden")


async def test_a_decision_lasts_no_longer_than_the_earliest_answer_it_came_from(
    tunnel: Tunnel, monkeypatch: pytest.MonkeyPatch
) -> None:
    context = tunnel.server.context
    clock = ManualClock(1000.0)
    access = AccessCache(context.store, ttl=5.0, clock=clock)
    monkeypatch.setattr(context, "access", access)
    await access.lookup_user(tunnel.alice_token)  # the user's answer: until 1005
    clock.now = 1004.9
    async with caller(tunnel.server) as connection:
        # The user's answer is reused, the grant's loaded now (until 1009.9).
        connection.send(get(tunnel, f"{PODS}/demo"))
        assert (await connection.reply()).status == 200
        # Another replica revokes the token: nothing tells this server.
        await context.store.revoke_api_tokens("alice")
        clock.now = 1006.0  # past the user's answer, within the grant's
        connection.send(get(tunnel, f"{PODS}/demo"))
        assert_status_object(await connection.reply(), 401, "Unauthorized")


async def test_a_watch_cancelled_while_its_open_is_being_sent_leaves_no_stream_open(
    tunnel: Tunnel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A burst's opens may be sent by the request's own task (Session.send_if_due);
    # a caller that leaves then must not leave its watch open on the tunnel.
    agent = tunnel.server.context.registry.get("prod-eu")
    assert agent is not None
    session = agent.session
    sending: list[asyncio.Future[None]] = []

    async def stuck(message: bytes) -> None:
        waiter = asyncio.get_running_loop().create_future()
        sending.append(waiter)
        await waiter

    # A batch of one: the request's task sends its OPEN, and the socket never takes it.
    monkeypatch.setattr(session, "batch_frames", 1)
    monkeypatch.setattr(session.transport, "send", stuck)
    async with caller(tunnel.server) as connection:
        connection.send(get(tunnel, f"{PODS}?watch=true"))
        await until(lambda: bool(sending))
        assert session.batches_sent_early == 1
        assert session.streams == 1
    await until(lambda: sending[0].cancelled())
    await until(lambda: session.streams == 0)
