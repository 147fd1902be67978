"""The bound on callers' connections, on a real server with real TLS.

Callers (anything without the client certificate of an agent) may hold at most
``--max-caller-connections`` connections: past it the longest idle one is
closed, and when every one serves a request the newcomer is answered 503.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

from cryptography import x509

from tests.e2e import test_kubectl_tunnel as kubectl_e2e
from tests.e2e.test_kubectl_tunnel import Tunnel
from tunnel_agent.credentials import DirectoryCredentialStore
from tunnel_pki.tls import client_context
from tunnel_server.app import API_KEEPALIVE
from tunnel_server.edge.callerlimit import MAX_CONNECTIONS_PER_AGENT
from tunnel_server.edge.frontdoor import KEEPALIVE_TIMEOUT

from ...integration.harness import running_server, server_settings
from ...integration.test_observability import server_metrics
from ...support import until
from ..frontdoor_support import (
    ANSWER_TIMEOUT,
    PODS,
    PREFIX,
    Caller,
    assert_status_object,
    caller,
    connect,
    get,
    lean_server,
    watching,
)

server = kubectl_e2e.server
tunnel = kubectl_e2e.tunnel

HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


async def test_at_the_limit_the_connection_idle_the_longest_is_closed_to_make_room(
    tunnel: Tunnel,
) -> None:
    async with (
        lean_server(tunnel.server, max_callers=2) as (port, doors),
        caller(tunnel.server, port) as first,
        caller(tunnel.server, port) as second,
    ):
        for connection in (first, second):
            connection.send(get(tunnel, f"{PODS}/demo"))
            assert (await connection.reply()).status == 200
        async with caller(tunnel.server, port) as third:
            assert await first.closed()
            for connection in (second, third):
                connection.send(get(tunnel, f"{PODS}/demo"))
                assert (await connection.reply()).status == 200
            assert (doors.callers.open, doors.callers.evicted) == (2, 1)


async def test_at_the_limit_with_every_connection_busy_a_new_caller_is_answered_503(
    tunnel: Tunnel,
) -> None:
    async with (
        lean_server(tunnel.server, max_callers=2) as (port, doors),
        watching(tunnel, port) as first,
        watching(tunnel, port),
        caller(tunnel.server, port) as refused,
    ):
        refused.send(get(tunnel, f"{PODS}/demo"))
        reply = await refused.reply()
        assert_status_object(reply, 503, "ServiceUnavailable")
        assert (
            "holds 2 caller connections, its limit (--max-caller-connections)"
            in (reply.json()["message"])
        )
        assert reply.header("retry-after") == "1"
        assert reply.header("connection") == "close"
        assert await refused.closed()
        assert doors.callers.refused == 1
        # The watches it could not displace go on.
        tunnel.stub.add_pod("later")
        event = await asyncio.wait_for(first.reader.readuntil(b"\n\r\n"), ANSWER_TIMEOUT)
        assert b'"later"' in event


async def test_one_address_holding_its_share_of_busy_connections_keeps_no_one_else_out(
    tunnel: Tunnel,
) -> None:
    async with (
        lean_server(tunnel.server, max_callers=4, per_address=2) as (port, doors),
        watching(tunnel, port, "127.0.0.2"),
        watching(tunnel, port, "127.0.0.2"),
        caller(tunnel.server, port, "127.0.0.2") as refused,
        caller(tunnel.server, port, "127.0.0.1") as other,
    ):
        refused.send(get(tunnel, f"{PODS}/demo"))
        reply = await refused.reply()
        assert_status_object(reply, 503, "ServiceUnavailable")
        assert (
            "your address holds 2 connections to the tunnel server, its limit per address"
            in (reply.json()["message"])
        )
        assert await refused.closed()
        other.send(get(tunnel, f"{PODS}/demo"))
        assert (await other.reply()).status == 200
        assert (doors.callers.refused, doors.callers.refused_per_address) == (1, 1)


async def test_past_its_share_an_address_loses_its_own_idle_connection_not_anothers(
    tunnel: Tunnel,
) -> None:
    async with (
        lean_server(tunnel.server, max_callers=4, per_address=1) as (port, doors),
        caller(tunnel.server, port, "127.0.0.1") as bystander,
        caller(tunnel.server, port, "127.0.0.2") as first,
    ):
        await until(lambda: doors.callers.open == 2)
        async with caller(tunnel.server, port, "127.0.0.2") as second:
            assert await first.closed()
            for connection in (bystander, second):
                connection.send(get(tunnel, f"{PODS}/demo"))
                assert (await connection.reply()).status == 200
            assert (doors.callers.evicted, doors.callers.held("127.0.0.2")) == (1, 1)


async def test_a_refused_connection_is_served_if_room_was_made_before_its_request(
    tunnel: Tunnel,
) -> None:
    async with lean_server(tunnel.server, max_callers=1) as (port, doors):
        async with watching(tunnel, port):
            late = await connect(tunnel.server, port)
            await until(lambda: doors.callers.refused == 1)
        await until(lambda: doors.callers.open == 1)  # the watch's connection closed
        try:
            late.send(get(tunnel, f"{PODS}/demo"))
            assert (await late.reply()).status == 200
        finally:
            await late.close()


async def test_a_connection_handed_to_aiohttp_counts_until_it_closes(tunnel: Tunnel) -> None:
    """The REST API and upgrades leave the front door but not the count; they are never evicted."""
    async with lean_server(tunnel.server, max_callers=1) as (port, doors):
        async with caller(tunnel.server, port) as handed:
            # A bootstrap whose body is still on its way: aiohttp's, and busy.
            handed.send(
                b"POST /api/v1/bootstrap HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
            )
            await until(lambda: not doors.open, max_turns=10**6)  # handed over
            async with caller(tunnel.server, port) as refused:
                refused.send(get(tunnel, f"{PODS}/demo"))
                assert_status_object(await refused.reply(), 503, "ServiceUnavailable")
        await until(lambda: doors.callers.open == 0)
        async with caller(tunnel.server, port) as later:
            later.send(get(tunnel, f"{PODS}/demo"))
            assert (await later.reply()).status == 200


async def test_a_connection_handed_to_aiohttp_serves_one_request_then_closes(
    tunnel: Tunnel,
) -> None:
    """Kept alive, a flood's connections could hold every place with a request a minute."""
    async with lean_server(tunnel.server) as (port, doors):
        async with caller(tunnel.server, port) as handed:
            handed.send(HEALTHZ)
            reply = await handed.reply()
            assert (reply.status, reply.header("connection")) == (200, "close")
            assert await handed.closed()
        await until(lambda: doors.callers.open == 0)


async def agent_serial(tunnel: Tunnel) -> int:
    """The serial of the certificate the tunnel's agent holds."""
    credentials = await DirectoryCredentialStore(tunnel.settings_dir / "creds").load()
    assert credentials is not None
    serial: int = x509.load_pem_x509_certificate(credentials.cert_pem).serial_number
    return serial


@asynccontextmanager
async def as_the_agent(tunnel: Tunnel, port: int) -> AsyncIterator[Caller]:
    """A raw connection presenting the tunnel's agent's own client certificate."""
    credentials = await DirectoryCredentialStore(tunnel.settings_dir / "creds").load()
    assert credentials is not None
    with_certificate = client_context(
        credentials.ca_pem, cert_pem=credentials.cert_pem, key_pem=credentials.key_pem
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=with_certificate)
    connection = Caller(reader, writer)
    try:
        yield connection
    finally:
        await connection.close()


async def test_an_agents_connection_is_not_counted_so_callers_cannot_keep_agents_out(
    tunnel: Tunnel,
) -> None:
    async with (
        lean_server(tunnel.server, max_callers=1) as (port, doors),
        watching(tunnel, port),
        as_the_agent(tunnel, port) as agent,
    ):
        agent.send(HEALTHZ)
        assert (await agent.reply()).status == 200
        assert (doors.callers.open, doors.callers.refused) == (1, 0)


async def test_past_a_few_connections_an_agent_certificate_counts_as_a_caller(
    tunnel: Tunnel,
) -> None:
    """Else one agent, or a thief with its key, could use up the server's file descriptors."""
    serial = await agent_serial(tunnel)
    async with lean_server(tunnel.server, max_callers=2) as (port, doors), AsyncExitStack() as held:
        connections = [
            await held.enter_async_context(as_the_agent(tunnel, port))
            for _ in range(MAX_CONNECTIONS_PER_AGENT + 2)
        ]
        for connection in connections:
            # Served by the front door, which keeps the connection (aiohttp would close it).
            connection.send(get(tunnel, f"{PODS}/demo"))
            assert (await connection.reply()).status == 200
        assert doors.agents.held(serial) == MAX_CONNECTIONS_PER_AGENT
        assert doors.callers.open == 2  # the two past the bound, as callers
        async with as_the_agent(tunnel, port) as one_more:
            one_more.send(get(tunnel, f"{PODS}/demo"))  # the idle longest makes room
            assert (await one_more.reply()).status == 200
        assert doors.callers.evicted == 1
    await until(lambda: doors.agents.held(serial) == 0)  # each released as it closed


async def test_a_revoked_agent_certificate_counts_as_a_caller(tunnel: Tunnel) -> None:
    """Only the agent socket refuses it: uncounted, its holder could keep connections idle."""
    tunnel.server.context.revoked.add(await agent_serial(tunnel))
    async with (
        lean_server(tunnel.server, max_callers=1) as (port, doors),
        watching(tunnel, port),
        as_the_agent(tunnel, port) as revoked,
    ):
        revoked.send(HEALTHZ)
        assert_status_object(await revoked.reply(), 503, "ServiceUnavailable")
        assert doors.callers.refused == 1


async def test_an_agent_certificate_revoked_while_connected_counts_from_its_next_request(
    tunnel: Tunnel,
) -> None:
    async with (
        lean_server(tunnel.server, max_callers=1) as (port, doors),
        watching(tunnel, port),
        as_the_agent(tunnel, port) as held,
    ):
        held.send(get(tunnel, f"{PODS}/demo"))  # alice's token: served, not counted
        assert (await held.reply()).status == 200
        assert doors.callers.open == 1  # the watch only
        tunnel.server.context.revoked.add(await agent_serial(tunnel))
        held.send(get(tunnel, f"{PODS}/demo"))
        assert_status_object(await held.reply(), 503, "ServiceUnavailable")


async def test_a_streamed_answer_from_aiohttp_says_the_connection_closes(tunnel: Tunnel) -> None:
    """A chunked upload goes through aiohttp, whose answer is streamed: its head says close."""
    body = b'{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "chunked"}}'
    async with caller(tunnel.server) as connection:
        connection.send(
            (
                f"POST {PREFIX}/api/v1/namespaces/default/configmaps HTTP/1.1\r\n"
                f"Host: x\r\nAuthorization: Bearer {tunnel.alice_token}\r\n"
                "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            ).encode()
            + f"{len(body):x}\r\n".encode()
            + body
            + b"\r\n0\r\n\r\n"
        )
        reply = await connection.reply()
        assert reply.status == 201, reply.body
        assert reply.header("connection") == "close"
        assert await connection.closed()


async def test_the_servers_own_listener_applies_the_limit(tmp_path: Path) -> None:
    """--max-caller-connections reaches the front doors of ``start_server``."""
    settings = server_settings(tmp_path / "state")
    limited = dataclasses.replace(settings.tunnel, max_caller_connections=1)
    async with running_server(dataclasses.replace(settings, tunnel=limited)) as limited_server:
        idle = await connect(limited_server)
        try:
            async with caller(limited_server) as newcomer:
                assert await idle.closed()
                newcomer.send(HEALTHZ)
                assert (await newcomer.reply()).status == 200
        finally:
            await idle.close()
        metrics = await server_metrics(limited_server)
        assert metrics[("tunnel_server_caller_connections_evicted_total", ())] == 1
        assert metrics[("tunnel_server_caller_connections_limit", ())] == 1


async def test_a_connection_handed_to_aiohttp_idles_briefly(tunnel: Tunnel) -> None:
    """aiohttp's own default keeps an idle connection for an hour; only an API client's is
    kept there at all, and it cannot be closed to make room: seconds, not minutes."""
    runner = tunnel.server.runner
    assert runner.server is not None
    assert runner.server().keepalive_timeout == API_KEEPALIVE
    assert API_KEEPALIVE <= KEEPALIVE_TIMEOUT / 10
