"""How the lean front end's connections and requests end, on a real server with real TLS.

Answers that come before their request's body (a second, read-only agent
refuses uploads before reading them), callers leaving mid-watch, idle
timeouts, shutdown, and agents whose answers break their own framing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from protocol import kinds
from protocol.http import RequestHead, encode_response_head
from tests.e2e import test_kubectl_tunnel as kubectl_e2e
from tests.e2e.test_kubectl_tunnel import Tunnel
from tunnel_agent.kubeapi import KubeApi, load_kube_configuration
from tunnel_agent.kubeproxy import KubeProxy
from tunnel_agent.policy import ProxyPolicy
from tunnel_agent.router import StreamRouter
from tunnel_mux import MuxStream, Session
from tunnel_server.edge.http1 import chunk

from ...integration.harness import agent_settings, running_agent
from ...support import until
from ..frontdoor_support import (
    ANSWER_TIMEOUT,
    PODS,
    Reply,
    assert_status_object,
    caller,
    connect,
    doors,
    get,
    grant_alice,
    lean_server,
    open_doors,
    request,
    watching,
)

# The stand-in API server behind a real agent, alice's user, grant and token:
# the e2e suite's fixtures, reused as they are.
server = kubectl_e2e.server
tunnel = kubectl_e2e.tunnel


# ------------------------------------------------- answers before the body


#: An upload larger than a stream's window (1 MiB): the server's upload blocks
#: on credit the agent, which answered without reading, never returns.
LARGE_BODY = b"x" * (4 * 1024 * 1024)
#: Requests per test: a stream left open by each would add up.
UPLOADS = 5


@dataclass
class ReadOnlyCluster:
    """A cluster granted to alice whose agent refuses writes before reading their body."""

    prefix: str
    server_session: Session
    agent_session: Session

    def open_streams(self) -> tuple[int, int, int, int]:
        """Streams open on the server's and the agent's sessions (and their protocols)."""
        return (
            self.server_session.streams,
            self.server_session.connection.open_streams,
            self.agent_session.streams,
            self.agent_session.connection.open_streams,
        )


@pytest.fixture
async def read_only(tunnel: Tunnel, tmp_path: Path) -> AsyncIterator[ReadOnlyCluster]:
    """A real agent with ``ProxyPolicy(read_only=True)`` before the stand-in API server."""
    bootstrap = await tunnel.server.add_cluster("frozen")
    await grant_alice(tunnel.server, "frozen")
    api = KubeApi(
        await load_kube_configuration(tunnel.stub.write_kubeconfig(tmp_path / "frozen.kc"))
    )
    proxy = KubeProxy(api, ProxyPolicy(read_only=True))
    router = StreamRouter()
    router.add(kinds.STREAM_HTTP, proxy.handle)
    settings = agent_settings(tunnel.server, "frozen", bootstrap, tmp_path / "frozen-creds")
    try:
        async with running_agent(settings, on_stream=router) as agent:
            await agent.wait_connected()
            # The server registers the agent just after the agent sees its HELLO.
            await until(lambda: tunnel.server.context.registry.get("frozen") is not None)
            connection = tunnel.server.context.registry.get("frozen")
            assert connection is not None
            assert agent.agent.session is not None
            yield ReadOnlyCluster("/k8s/clusters/frozen", connection.session, agent.agent.session)
    finally:
        await proxy.close()
        await api.close()


def upload_head(cluster: ReadOnlyCluster, tunnel: Tunnel, *headers: str) -> bytes:
    """The head of a configmap create on ``cluster``, blank line included."""
    head, _, _ = request(
        "POST",
        f"{cluster.prefix}/api/v1/namespaces/default/configmaps",
        tunnel.alice_token,
        "Content-Type: application/json",
        *headers,
    ).partition(b"\r\n\r\n")
    return head + b"\r\n\r\n"


def assert_refused_as_read_only(reply: Reply) -> None:
    """The agent's refusal, whole: its Status parses and names the policy."""
    assert_status_object(reply, 403, "Forbidden")
    assert "read-only" in reply.json()["message"]


async def test_front_door_uploads_answered_before_their_body_leave_no_stream_open(
    tunnel: Tunnel, read_only: ReadOnlyCluster
) -> None:
    assert read_only.open_streams() == (0, 0, 0, 0)
    length = f"Content-Length: {len(LARGE_BODY)}"
    for _ in range(UPLOADS):
        async with caller(tunnel.server) as connection:
            connection.send(upload_head(read_only, tunnel, length) + LARGE_BODY)
            assert_refused_as_read_only(await connection.reply())
            assert len(doors(tunnel.server).open) == 1  # the front door served it
    await until(lambda: read_only.open_streams() == (0, 0, 0, 0), max_turns=10**6)


async def test_aiohttp_uploads_answered_before_their_body_leave_no_stream_open(
    tunnel: Tunnel, read_only: ReadOnlyCluster
) -> None:
    """A chunked body goes to aiohttp's route: its upload, cut short, resets the stream too."""
    assert read_only.open_streams() == (0, 0, 0, 0)
    for _ in range(UPLOADS):
        async with caller(tunnel.server) as connection:
            connection.send(
                upload_head(read_only, tunnel, "Transfer-Encoding: chunked")
                + chunk(LARGE_BODY)
                + b"0\r\n\r\n"
            )
            assert_refused_as_read_only(await connection.reply())
            assert doors(tunnel.server).open == set()  # aiohttp served it
    await until(lambda: read_only.open_streams() == (0, 0, 0, 0), max_turns=10**6)


async def test_an_early_answer_says_close_and_the_connection_closes_after_the_body(
    tunnel: Tunnel, read_only: ReadOnlyCluster
) -> None:
    """The caller, still sending, reads the whole answer: no reset; the close comes at the end."""
    length = f"Content-Length: {len(LARGE_BODY)}"
    first, rest = LARGE_BODY[: 1024 * 1024], LARGE_BODY[1024 * 1024 :]
    async with caller(tunnel.server) as connection:
        connection.send(upload_head(read_only, tunnel, length) + first)
        refused = await connection.reply()
        assert_refused_as_read_only(refused)
        assert refused.header("connection") == "close"
        (door,) = open_doors(tunnel.server)
        # The caller goes on with its body, as a client that writes before it reads.
        piece = 256 * 1024
        for offset in range(0, len(rest) - 1, piece):
            connection.send(rest[offset : min(offset + piece, len(rest) - 1)])
            await connection.writer.drain()
        # White box: all but the body's last byte came, and the server still
        # holds the connection open (it closes at the body's end, not before).
        await until(lambda: door._body is not None and door._body.remaining == 1, max_turns=10**6)
        assert door in doors(tunnel.server).open
        assert door._transport is not None
        assert not door._transport.is_closing()
        connection.send(rest[-1:])
        await connection.writer.drain()
        assert await connection.closed()  # EOF, nothing more, no reset
    await until(lambda: read_only.open_streams() == (0, 0, 0, 0), max_turns=10**6)


# ------------------------------------------------------------------- watches


async def test_a_caller_leaving_mid_watch_ends_the_watch_upstream(tunnel: Tunnel) -> None:
    store = tunnel.stub.store
    assert store.watcher_count == 0
    connection = await connect(tunnel.server)
    try:
        connection.send(get(tunnel, f"{PODS}?watch=true"))
        head = await asyncio.wait_for(connection.reader.readuntil(b"\r\n\r\n"), ANSWER_TIMEOUT)
        assert head.startswith(b"HTTP/1.1 200 ")
        assert b"transfer-encoding: chunked" in head
        first = await asyncio.wait_for(connection.reader.readuntil(b"\n\r\n"), ANSWER_TIMEOUT)
        assert b'"ADDED"' in first
        assert b'"demo"' in first
        assert store.watcher_count == 1
    finally:
        await connection.close()
    await until(lambda: store.watcher_count == 0, max_turns=10**7)


async def test_a_caller_closing_its_tls_session_mid_watch_logs_no_warning(
    tunnel: Tunnel, caplog: pytest.LogCaptureFixture
) -> None:
    """kubectl closes its TLS session (close_notify) when interrupted: that is routine."""
    store = tunnel.stub.store
    async with caller(tunnel.server) as connection:
        connection.send(get(tunnel, f"{PODS}?watch=true"))
        await asyncio.wait_for(connection.reader.readuntil(b"\r\n\r\n"), ANSWER_TIMEOUT)
        await asyncio.wait_for(connection.reader.readuntil(b"\n\r\n"), ANSWER_TIMEOUT)
    await until(lambda: store.watcher_count == 0, max_turns=10**7)
    asyncio_warnings = [
        r.getMessage()
        for r in caplog.records
        if r.name == "asyncio" and r.levelno >= logging.WARNING
    ]
    assert asyncio_warnings == []


# ---------------------------------------------------------------- idle time


async def test_an_idle_connection_is_closed_after_the_keepalive_timeout(tunnel: Tunnel) -> None:
    async with lean_server(tunnel.server, keepalive_timeout=0.2) as (port, front_doors):
        async with caller(tunnel.server, port) as connection:
            connection.send(get(tunnel, f"{PODS}/demo"))
            reply = await connection.reply()
            assert reply.json()["metadata"]["name"] == "demo"
            idle_since = time.monotonic()
            assert len(front_doors.open) == 1
            assert await connection.closed()
            assert time.monotonic() - idle_since > 0.1  # idle for a while, not closed at once
        await until(lambda: not front_doors.open)


async def test_the_keepalive_timeout_counts_from_the_last_request_not_the_first(
    tunnel: Tunnel,
) -> None:
    async with (
        lean_server(tunnel.server, keepalive_timeout=0.6) as (port, _),
        caller(tunnel.server, port) as connection,
    ):
        connection.send(get(tunnel, f"{PODS}/demo"))
        assert (await connection.reply()).status == 200
        # The scenario, not a synchronisation: idle for two thirds of the
        # timeout, then busy again, past the first request's deadline (a
        # stall of up to 0.2 s on a busy machine still leaves the connection open).
        await asyncio.sleep(0.4)
        connection.send(get(tunnel, f"{PODS}/demo"))
        assert (await connection.reply()).status == 200
        second_answered = time.monotonic()
        assert await connection.closed()
        # Closed a whole timeout after the second answer (timers only fire late).
        assert time.monotonic() - second_answered >= 0.55


async def test_a_connection_that_never_finishes_its_head_is_closed_after_the_timeout(
    tunnel: Tunnel,
) -> None:
    async with (
        lean_server(tunnel.server, keepalive_timeout=0.2) as (port, _),
        caller(tunnel.server, port) as connection,
    ):
        connection.send(f"GET {PODS}/demo HTTP/1.1\r\nHost: x\r\n".encode())
        assert await connection.closed()


async def test_a_request_in_progress_is_not_cut_by_the_keepalive_timeout(
    tunnel: Tunnel,
) -> None:
    """The timer runs between requests only: a watch outlives it."""
    async with (
        lean_server(tunnel.server, keepalive_timeout=0.2) as (port, _),
        watching(tunnel, port) as watch,
    ):
        async with caller(tunnel.server, port) as idle:
            # Its end shows a whole timeout has passed since the watch started.
            assert await idle.closed()
        tunnel.stub.add_pod("later")
        event = await asyncio.wait_for(watch.reader.readuntil(b"\n\r\n"), ANSWER_TIMEOUT)
        assert b'"later"' in event


# ---------------------------------------------------------------- shutdown


async def test_stop_server_closes_open_front_door_connections(tunnel: Tunnel) -> None:
    async with caller(tunnel.server) as idle, caller(tunnel.server) as partial:
        idle.send(get(tunnel, f"{PODS}/demo"))
        assert (await idle.reply()).status == 200
        partial.send(f"GET {PODS}/demo HTTP/1.1\r\n".encode())
        await until(lambda: len(doors(tunnel.server).open) == 2, max_turns=10**6)
        stopping = asyncio.create_task(tunnel.server.stop())
        assert await idle.closed()
        assert await partial.closed()
        await stopping


async def test_stop_server_aborts_a_connection_whose_caller_does_not_read(
    tunnel: Tunnel,
) -> None:
    """The response waits on the caller; the stop does not (the caller sees the end)."""
    line = "y" * 3_000
    lines = 10_000  # the stand-in's log bound: 30 MB, more than the sockets hold
    tunnel.stub.append_log("default", "demo", "\n".join([line] * lines))
    connection = await connect(tunnel.server)
    try:
        connection.send(get(tunnel, f"{PODS}/demo/log"))
        head = await asyncio.wait_for(connection.reader.readuntil(b"\r\n\r\n"), ANSWER_TIMEOUT)
        assert head.startswith(b"HTTP/1.1 200 ")
        (door,) = open_doors(tunnel.server)
        # White box: the caller's socket is full; the response waits on it.
        await until(lambda: door._writing_paused, max_turns=10**7)
        stopping = asyncio.create_task(tunnel.server.stop())
        done, _ = await asyncio.wait({stopping}, timeout=ANSWER_TIMEOUT)
        if stopping not in done:
            # End the stop from the caller's side: a server left half stopped
            # would hang the rest of the run instead of failing this test.
            connection.writer.transport.abort()
            await stopping
            pytest.fail("the server's stop waited on a caller that does not read")
        stopping.result()
        assert doors(tunnel.server).open == set()
        received = 0
        with contextlib.suppress(ConnectionError):
            while data := await asyncio.wait_for(connection.reader.read(1 << 20), ANSWER_TIMEOUT):
                received += len(data)
        assert received < lines * (len(line) + 1)  # cut short: EOF or a reset, not the whole log
    finally:
        await connection.close()


# ----------------------------------------------- answers the agent gets wrong


async def misbehaving_agent(stream: MuxStream) -> None:
    """Answers by path: an invalid length, a body longer or shorter than its length."""
    path = RequestHead.from_open_headers(stream.headers).path
    if path == "/bad-length":
        await stream.write(encode_response_head(200, "OK", [("content-length", "many")]))
    elif path == "/too-long":
        await stream.write(encode_response_head(200, "OK", [("content-length", "2")]) + b"toolong")
    elif path == "/too-short":
        await stream.write(encode_response_head(200, "OK", [("content-length", "10")]) + b"short")
    stream.end()


@pytest.fixture
async def broken(tunnel: Tunnel, tmp_path: Path) -> AsyncIterator[str]:
    """A second cluster, granted to alice, whose agent answers with ``misbehaving_agent``."""
    bootstrap = await tunnel.server.add_cluster("broken")
    await grant_alice(tunnel.server, "broken")
    settings = agent_settings(tunnel.server, "broken", bootstrap, tmp_path / "broken-creds")
    async with running_agent(settings, on_stream=misbehaving_agent) as agent:
        await agent.wait_connected()
        yield "/k8s/clusters/broken"


async def test_an_agent_answer_with_an_invalid_length_is_answered_502(
    tunnel: Tunnel, broken: str
) -> None:
    async with caller(tunnel.server) as connection:
        connection.send(get(tunnel, f"{broken}/bad-length"))
        reply = await connection.reply()
        assert_status_object(reply, 502, "BadGateway")


@pytest.mark.parametrize("path", ["/too-long", "/too-short"])
async def test_an_agent_body_that_breaks_its_length_ends_the_callers_connection(
    tunnel: Tunnel, broken: str, path: str
) -> None:
    async with caller(tunnel.server) as connection:
        connection.send(get(tunnel, broken + path))
        head = await asyncio.wait_for(connection.reader.readuntil(b"\r\n\r\n"), ANSWER_TIMEOUT)
        assert head.startswith(b"HTTP/1.1 200 ")
        length = 2 if path == "/too-long" else 10
        assert f"content-length: {length}".encode() in head
        rest = await asyncio.wait_for(connection.reader.read(), ANSWER_TIMEOUT)
        # The caller sees the break: the connection ends before a whole body.
        assert len(rest) < length
