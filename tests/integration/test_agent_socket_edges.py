"""The agent socket's edges: revocation while an agent is half-way, and what an agent says.

Found in review: an agent that held its HELLO across ``tunnelctl cluster
revoke`` was attached after it; a session whose certificate was revoked could
still trade a CSR for a fresh, unrevoked certificate; and the version an agent
announced went to the server's log with its line breaks.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest

from protocol import Connection, ErrorCode, Event, GoAwayReceived, Limits, Side, kinds
from protocol.allowance import ALLOWANCE_START
from protocol.frames import (
    GoAwayFrame,
    OpenFrame,
    ResetFrame,
    WindowFrame,
    decode_message,
    encode_message,
)
from protocol.records import RecordReader, encode_record
from tunnel_mux import Session, SessionHandlers, StreamResetError, WebSocketTransport
from tunnel_pki.certs import load_certificate
from tunnel_pki.csr import make_csr
from tunnel_pki.keys import generate_private_key, private_key_to_pem
from tunnel_pki.tls import client_context
from tunnel_server.agents.endpoint import REVOKED_SESSION
from tunnel_server.clock import utcnow
from tunnel_server.commands import dispatcher as dispatcher_module

from ..protocol.pair import READ_ALL, of_type
from ..support import until
from .commands_support import command
from .harness import RunningServer
from .test_observability import server_metrics

#: Bound on waiting for what should happen at once (a hang fails by name).
PROMPTLY = 10.0


async def bootstrapped(server: RunningServer, cluster: str) -> tuple[bytes, bytes]:
    """An agent's key and certificate (PEM), traded for a bootstrap token as the agent does."""
    token = await server.add_cluster(cluster)
    key = generate_private_key()
    body = {"cluster": cluster, "token": token, "csr": make_csr(key, cluster).decode()}
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            server.url + kinds.PATH_BOOTSTRAP, json=body, ssl=client_context(server.ca_pem)
        ) as response,
    ):
        answer = await response.json()
        assert response.status == 200, answer
    return private_key_to_pem(key), answer["certificate"].encode()


@asynccontextmanager
async def upgraded(
    server: RunningServer, key_pem: bytes, cert_pem: bytes
) -> AsyncIterator[aiohttp.ClientWebSocketResponse]:
    """The agent's WebSocket, upgraded, before the session's HELLO."""
    tls = client_context(server.ca_pem, cert_pem=cert_pem, key_pem=key_pem)
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(server.url + kinds.PATH_AGENT_CONNECT, ssl=tls, compress=0) as socket,
    ):
        yield socket


class Messages:
    """What the server sends an agent's session outside streams."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()

    def __call__(self, kind: str, body: dict[str, Any]) -> None:
        self.queue.put_nowait((kind, body))

    async def next(self) -> tuple[str, dict[str, Any]]:
        return await asyncio.wait_for(self.queue.get(), PROMPTLY)


def agent_session(
    socket: aiohttp.ClientWebSocketResponse, messages: Messages, version: str = "test"
) -> Session:
    return Session(
        WebSocketTransport(socket),
        Connection(Side.CLIENT, Limits(), info={kinds.INFO_AGENT_VERSION: version}),
        handlers=SessionHandlers(on_message=messages),
    )


def renewal_request(cluster: str) -> dict[str, Any]:
    return {"csr": make_csr(generate_private_key(), cluster).decode()}


async def test_an_agent_whose_hello_comes_after_its_revocation_is_not_attached(
    server: RunningServer,
) -> None:
    key_pem, cert_pem = await bootstrapped(server, "prod")
    async with upgraded(server, key_pem, cert_pem) as socket:
        status, answer = await server.api("POST", "/api/v1/clusters/prod/revoke")
        assert (status, answer["disconnected"]) == (200, False)  # nothing attached yet
        session = agent_session(socket, Messages())
        run = asyncio.create_task(session.run())
        # The server ends the session once it has its HELLO, without attaching it.
        await asyncio.wait_for(run, PROMPTLY)
    assert server.context.registry.get("prod") is None


@asynccontextmanager
async def attached(
    server: RunningServer, cluster: str, version: str = "test"
) -> AsyncIterator[tuple[Session, Messages]]:
    """An agent's session, attached, and what the server sends it."""
    key_pem, cert_pem = await bootstrapped(server, cluster)
    async with upgraded(server, key_pem, cert_pem) as socket:
        messages = Messages()
        session = agent_session(socket, messages, version)
        run = asyncio.create_task(session.run())
        try:
            await asyncio.wait_for(session.wait_ready(), PROMPTLY)
            await until(lambda: server.context.registry.get(cluster) is not None)
            yield session, messages
        finally:
            await session.close()
            await run


async def test_a_session_whose_certificate_is_revoked_gets_no_new_one(
    server: RunningServer,
) -> None:
    async with attached(server, "prod") as (session, messages):
        agent = server.context.registry.get("prod")
        assert agent is not None
        # Between the revocation and the disconnection it brings, the session is still open.
        server.context.revoked.add(agent.serial)
        session.send_message(kinds.MESSAGE_CERT_RENEW, renewal_request("prod"))
        kind, body = await messages.next()
    assert (kind, body["message"]) == (kinds.MESSAGE_CERT_REFUSED, REVOKED_SESSION)


async def test_a_certificate_signed_while_its_session_is_revoked_is_revoked_too(
    server: RunningServer,
) -> None:
    async with attached(server, "prod") as (session, messages):
        store = server.context.store
        # Revoked in the store, not yet in the server's memory: as while a
        # revocation is on its way there.
        assert await store.revoke_cluster_certificates("prod", utcnow()) == 1
        session.send_message(kinds.MESSAGE_CERT_RENEW, renewal_request("prod"))
        kind, body = await messages.next()
        revoked = await store.revoked_serials()
    assert (kind, body["message"]) == (kinds.MESSAGE_CERT_REFUSED, REVOKED_SESSION)
    # The one signed meanwhile went with the rest: two revoked, and known as such.
    assert len(revoked) == 2
    assert revoked <= server.context.revoked


async def test_a_session_whose_certificate_stands_is_renewed(server: RunningServer) -> None:
    async with attached(server, "prod") as (session, messages):
        session.send_message(kinds.MESSAGE_CERT_RENEW, renewal_request("prod"))
        kind, body = await messages.next()
    assert kind == kinds.MESSAGE_CERT_ISSUED
    serial = load_certificate(body["certificate"].encode()).serial_number
    assert serial not in await server.context.store.revoked_serials()


async def test_the_version_an_agent_announces_cannot_forge_log_lines(
    server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    forged = "1.0\n2026-11-27 00:00:00,000 WARNING tunnel_server.api.clusters: cluster deleted"
    with caplog.at_level(logging.INFO, logger="tunnel_server.agents.endpoint"):
        async with attached(server, "prod", forged):
            status, view = await server.api("GET", "/api/v1/clusters/prod")
    assert status == 200
    assert view["agent_version"] == forged[:64].replace("\n", "?")
    assert all("\n" not in record.getMessage() for record in caplog.records)


async def test_a_cluster_renews_at_most_once_in_a_tenth_of_a_lifetime(
    server: RunningServer,
) -> None:
    async with attached(server, "prod") as (session, messages):
        session.send_message(kinds.MESSAGE_CERT_RENEW, renewal_request("prod"))
        first, _ = await messages.next()
        session.send_message(kinds.MESSAGE_CERT_RENEW, renewal_request("prod"))
        second, body = await messages.next()
    assert (first, second) == (kinds.MESSAGE_CERT_ISSUED, kinds.MESSAGE_CERT_REFUSED)
    # The default lifetime is 30 days: a tenth is three.
    assert "renewed less than 259200s ago (a tenth of its lifetime)" in body["message"]


async def test_a_log_for_an_attempt_that_is_not_current_is_not_stored(
    server: RunningServer,
) -> None:
    async with attached(server, "prod") as (session, _):
        status, created = await server.api(
            "POST", "/api/v1/clusters/prod/commands", {"spec": command("build")}
        )
        assert status == 201
        # No attempt 7 was ever offered: an agent's forged report of it.
        stream = session.open_stream(
            kinds.STREAM_COMMAND_REPORT, {"id": created["id"], "attempt": 7}
        )
        await stream.write(encode_record({"event": "log", "lines": ["a forged line"]}))
        reader = RecordReader()
        replies: list[dict[str, Any]] = []
        while not replies and (chunk := await asyncio.wait_for(stream.read(), PROMPTLY)):
            replies = reader.feed(chunk)
    assert replies == [{"stale": "this attempt is no longer current"}]
    status, logs = await server.api("GET", f"/api/v1/commands/{created['id']}/logs")
    assert status == 200
    assert "a forged line" not in json.dumps(logs)


async def test_unfinished_report_records_of_a_cluster_are_held_within_a_bound(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Else one agent's 2,048 streams, each with most of a 2 MiB record, held 4 GiB.
    monkeypatch.setattr(dispatcher_module, "MAX_REPORT_BUFFER", 64 * 1024)
    dispatcher = server.context.commands
    async with attached(server, "prod") as (session, _):
        status, created = await server.api(
            "POST", "/api/v1/clusters/prod/commands", {"spec": command("build")}
        )
        assert status == 201
        streams = []
        for _ in range(4):  # 20 KiB each of a record that never ends
            stream = session.open_stream(
                kinds.STREAM_COMMAND_REPORT, {"id": created["id"], "attempt": 1}
            )
            await stream.write(b'{"event": "log", "lines": ["' + b"x" * 20 * 1024)
            streams.append(stream)
        # The fourth would take the cluster past the bound: it is reset.
        await until(lambda: streams[3].error is not None, max_turns=10**6)
        assert "reports hold too many unfinished records" in str(streams[3].error)
        assert all(stream.error is None for stream in streams[:3])
        assert dispatcher.report_buffered["prod"] == 3 * (20 * 1024 + 28)
        for stream in streams[:3]:
            stream.reset()
        await until(lambda: "prod" not in dispatcher.report_buffered, max_turns=10**6)


async def test_a_stream_of_a_kind_the_server_does_not_take_is_refused_and_the_session_stays(
    server: RunningServer,
) -> None:
    async with attached(server, "prod") as (session, _):
        stream = session.open_stream(kinds.STREAM_HTTP, {})
        with pytest.raises(StreamResetError) as refused:
            await asyncio.wait_for(stream.read(), PROMPTLY)
        assert refused.value.code == ErrorCode.REFUSED_STREAM
        assert refused.value.reason == "this side takes no http streams"
        assert await asyncio.wait_for(session.ping(), PROMPTLY) >= 0
        assert server.context.registry.get("prod") is not None


async def test_report_streams_the_server_refuses_do_not_fund_a_flood(
    server: RunningServer,
) -> None:
    # Found in review: each stream the server reset earned the agent up to
    # 2,050 frames, so a report the handler refuses (it has no id) paid for a
    # thousand WINDOWs sent with it, round after round.
    key_pem, cert_pem = await bootstrapped(server, "prod")
    async with upgraded(server, key_pem, cert_pem) as socket:
        agent = Connection(Side.CLIENT, Limits(), info={kinds.INFO_AGENT_VERSION: "hand"})
        for hello in agent.data_to_send():
            await socket.send_bytes(hello)
        while agent.version is None:
            agent.receive_data((await asyncio.wait_for(socket.receive(), PROMPTLY)).data, 0.0)
        goaways: list[GoAwayFrame] = []
        for report in range(1, 6 * ALLOWANCE_START // 1000, 2):
            opened = OpenFrame(report, kinds.STREAM_COMMAND_REPORT, {})
            await socket.send_bytes(encode_message([opened] + [WindowFrame(0, 1)] * 1000))
            refused = False
            while not refused and not goaways:  # the server's answer to this round
                message = await asyncio.wait_for(socket.receive(), PROMPTLY)
                assert message.type is aiohttp.WSMsgType.BINARY, message
                frames = decode_message(message.data, READ_ALL)
                refused = any(reset.stream_id == report for reset in of_type(frames, ResetFrame))
                goaways = of_type(frames, GoAwayFrame)
            if goaways:
                break
    assert [goaway.code for goaway in goaways] == [ErrorCode.EXCESSIVE_LOAD]


async def test_an_agent_flooding_frames_without_data_is_cut_off_and_no_other(
    server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    # A WebSocket message of 10,000 WINDOWs, 40 KB, costs the server a few
    # milliseconds of its one event loop (protocol/allowance.py).
    flood = encode_message([WindowFrame(0, 1)] * ALLOWANCE_START)
    key_pem, cert_pem = await bootstrapped(server, "prod")
    with caplog.at_level(logging.WARNING, logger="tunnel_mux.session"):
        async with (
            attached(server, "dev") as (other, _),
            upgraded(server, key_pem, cert_pem) as socket,
        ):
            agent = Connection(Side.CLIENT, Limits(), info={kinds.INFO_AGENT_VERSION: "hand"})
            for hello in agent.data_to_send():
                await socket.send_bytes(hello)
            await until(lambda: server.context.registry.get("prod") is not None)

            await socket.send_bytes(flood)  # its whole allowance, and the server's earnings
            await socket.send_bytes(flood)
            events: list[Event] = []
            async for message in socket:  # until the server closes the socket
                if message.type is aiohttp.WSMsgType.BINARY:
                    events += agent.receive_data(message.data, 0.0)
                    for answer in agent.data_to_send():  # PONGs
                        await socket.send_bytes(answer)
            await until(lambda: server.context.registry.get("prod") is None)

            [goaway] = of_type(events, GoAwayReceived)
            assert goaway.code == ErrorCode.EXCESSIVE_LOAD
            assert "frames without data" in goaway.reason
            # The other cluster's agent is still attached, and its session answers.
            assert server.context.registry.get("dev") is not None
            assert await asyncio.wait_for(other.ping(), PROMPTLY) >= 0
    assert any("frames without data" in record.getMessage() for record in caplog.records)
    cut = ("tunnel_server_agent_protocol_errors_total", (("code", "EXCESSIVE_LOAD"),))
    assert (await server_metrics(server))[cut] == 1
