"""The lean HTTP/1.1 front end, byte for byte, on a real server with real TLS.

Each test speaks raw HTTP/1.1 over an asyncio TLS stream (trusting the
server's CA) so it controls the bytes exactly: keep-alive and pipelining,
response framing, request bodies, the hand-over to aiohttp at a request
boundary, and refusals. Behind the server is a real agent relaying to the
Kubernetes API stand-in (the e2e ``tunnel`` fixture).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import pytest

from tests.e2e import test_kubectl_tunnel as kubectl_e2e
from tests.e2e.test_kubectl_tunnel import Tunnel
from tunnel_server.edge import frontdoor
from tunnel_server.edge.http1 import MAX_HEAD, chunk
from tunnel_server.store.base import StoreError, User

from ...integration.harness import RunningServer
from ...support import assert_tcp_keepalive, until
from ..frontdoor_support import (
    ANSWER_TIMEOUT,
    PODS,
    PREFIX,
    assert_closed_as_designed,
    assert_status_object,
    caller,
    doors,
    get,
    grant_alice,
    open_doors,
    request,
)

# The stand-in API server behind a real agent, alice's user, grant and token:
# the e2e suite's fixtures, reused as they are.
server = kubectl_e2e.server
tunnel = kubectl_e2e.tunnel


# ------------------------------------------------- keep-alive and pipelining


async def test_a_callers_connection_has_tcp_keepalive_so_a_vanished_caller_is_noticed(
    tunnel: Tunnel,
) -> None:
    # A caller that vanishes without a FIN in a quiet exec session or logs -f
    # would otherwise hold its request open for ever (tcp_keepalive.py).
    async with caller(tunnel.server) as connection:
        connection.send(get(tunnel, f"{PODS}/demo"))
        assert (await connection.reply()).status == 200
        ours = connection.writer.get_extra_info("sockname")
        [transport] = [
            door._transport
            for door in open_doors(tunnel.server)
            if door._transport is not None and door._transport.get_extra_info("peername") == ours
        ]
        sock = transport.get_extra_info("socket")
        assert_tcp_keepalive(sock)


async def test_two_requests_on_one_keep_alive_connection_are_answered_in_order(
    tunnel: Tunnel,
) -> None:
    tunnel.stub.add_pod("second")
    async with caller(tunnel.server) as connection:
        connection.send(get(tunnel, f"{PODS}/demo"))
        first = await connection.reply()
        connection.send(get(tunnel, f"{PODS}/second"))
        second = await connection.reply()
        assert (first.status, second.status) == (200, 200)
        assert first.json()["metadata"]["name"] == "demo"
        assert second.json()["metadata"]["name"] == "second"
        assert first.header("connection") is None  # kept alive
        assert len(doors(tunnel.server).open) == 1  # served by the front door throughout


async def test_two_pipelined_requests_in_one_write_are_answered_in_order(tunnel: Tunnel) -> None:
    tunnel.stub.add_pod("second")
    async with caller(tunnel.server) as connection:
        connection.send(get(tunnel, f"{PODS}/second"), get(tunnel, f"{PODS}/demo"))
        first = await connection.reply()
        second = await connection.reply()
        assert (first.status, second.status) == (200, 200)
        assert first.json()["metadata"]["name"] == "second"
        assert second.json()["metadata"]["name"] == "demo"
        # The connection is still usable after the pipeline.
        connection.send(get(tunnel, f"{PODS}/demo"))
        assert (await connection.reply()).status == 200


async def test_a_request_pipelined_right_after_a_body_is_answered(tunnel: Tunnel) -> None:
    body = json.dumps(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "piped"}, "data": {"a": "1"}}
    ).encode()
    async with caller(tunnel.server) as connection:
        connection.send(
            request(
                "POST",
                f"{PREFIX}/api/v1/namespaces/default/configmaps",
                tunnel.alice_token,
                "Content-Type: application/json",
                body=body,
            ),
            get(tunnel, f"{PREFIX}/api/v1/namespaces/default/configmaps/piped"),
        )
        created = await connection.reply()
        fetched = await connection.reply()
        assert created.status == 201
        assert fetched.status == 200
        assert fetched.json()["data"] == {"a": "1"}


async def test_heads_sent_one_byte_per_write_over_tls_are_answered(tunnel: Tunnel) -> None:
    """The head's end is searched in what came since the last read, across read boundaries."""
    tunnel.stub.add_pod("second")
    async with caller(tunnel.server) as connection:
        # The longer head first: the search must start over for the next one.
        for name, padding in (("demo", ("X-Pad: " + "p" * 300,)), ("second", ())):
            data = get(tunnel, f"{PODS}/{name}", *padding)
            for sent in range(1, len(data)):
                connection.send(data[sent - 1 : sent])
                await connection.writer.drain()
                # White box: each byte was read apart (its own data_received).
                await until(holds(tunnel.server, sent), max_turns=10**6)
            connection.send(data[-1:])
            reply = await connection.reply()
            assert reply.status == 200
            assert reply.json()["metadata"]["name"] == name
        assert len(doors(tunnel.server).open) == 1  # served by the front door throughout


def holds(server: RunningServer, count: int) -> Callable[[], bool]:
    """Whether the one open front door holds ``count`` bytes of a head (white box)."""

    def condition() -> bool:
        # The server may not have finished its TLS handshake when the first byte goes.
        return [len(door._buffer) for door in open_doors(server)] == [count]

    return condition


# ---------------------------------------------------------- response framing


async def test_a_chunked_upstream_response_is_re_chunked_whole(tunnel: Tunnel) -> None:
    lines = [f"line {number} " + "x" * 100 for number in range(2000)]
    tunnel.stub.append_log("default", "demo", "\n".join(lines))
    async with caller(tunnel.server) as connection:
        connection.send(get(tunnel, f"{PODS}/demo/log"))
        reply = await connection.reply()
        assert reply.status == 200
        assert reply.header("transfer-encoding") == "chunked"
        assert reply.header("content-length") is None
        assert reply.body.decode() == "".join(line + "\n" for line in lines)
        # The last chunk ended the body exactly: the next answer parses.
        connection.send(get(tunnel, f"{PODS}/demo"))
        assert (await connection.reply()).json()["metadata"]["name"] == "demo"


async def test_a_content_length_upstream_response_keeps_its_length(tunnel: Tunnel) -> None:
    async with caller(tunnel.server) as connection:
        connection.send(get(tunnel, f"{PODS}/demo"))
        reply = await connection.reply()
        assert reply.status == 200
        assert reply.header("transfer-encoding") is None
        assert reply.header("content-length") == str(len(reply.body))
        assert reply.json()["metadata"]["name"] == "demo"
        connection.send(get(tunnel, f"{PODS}/demo"))
        assert (await connection.reply()).status == 200


async def test_a_head_request_gets_the_head_and_no_body(tunnel: Tunnel) -> None:
    async with caller(tunnel.server) as connection:
        connection.send(request("HEAD", f"{PREFIX}/api/v1", tunnel.alice_token))
        head = await connection.reply(head=True)
        assert head.status == 200
        assert head.header("transfer-encoding") is None
        # Had any body byte followed the head, this answer would not parse.
        connection.send(get(tunnel, f"{PODS}/demo"))
        reply = await connection.reply()
        assert reply.json()["metadata"]["name"] == "demo"
    assert [e.method for e in tunnel.stub.requests if e.path == "/api/v1"] == ["HEAD"]


# -------------------------------------------------------------- request body


async def test_a_request_body_with_content_length_reaches_the_api_server_intact(
    tunnel: Tunnel,
) -> None:
    # Larger than the body's high-water mark: reading from the caller pauses and resumes.
    blob = "".join(chr(0x41 + n % 26) for n in range(600_000))
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "settings", "namespace": "default"},
        "data": {"colour": "blue", "blob": blob},
    }
    body = json.dumps(configmap).encode()
    async with caller(tunnel.server) as connection:
        connection.send(
            request(
                "POST",
                f"{PREFIX}/api/v1/namespaces/default/configmaps",
                tunnel.alice_token,
                "Content-Type: application/json",
                body=body,
            )
        )
        created = await connection.reply()
        assert created.status == 201, created.body[:300]
        stored = tunnel.stub.get("v1", "ConfigMap", "settings", "default")
        assert stored is not None
        assert stored["data"] == {"colour": "blue", "blob": blob}
        # Read it back on the same connection: the body did not leak into the next request.
        connection.send(get(tunnel, f"{PREFIX}/api/v1/namespaces/default/configmaps/settings"))
        fetched = await connection.reply()
        assert fetched.json()["data"] == {"colour": "blue", "blob": blob}


# -------------------------------------------------------- ending connections


async def test_connection_close_is_answered_with_connection_close_then_closed(
    tunnel: Tunnel,
) -> None:
    async with caller(tunnel.server) as connection:
        connection.send(get(tunnel, f"{PODS}/demo", "Connection: close"))
        reply = await connection.reply()
        assert reply.status == 200
        assert reply.header("connection") == "close"
        assert await connection.closed()


async def test_a_malformed_head_is_answered_400_and_the_connection_closed(
    tunnel: Tunnel, caplog: pytest.LogCaptureFixture
) -> None:
    async with caller(tunnel.server) as connection:
        connection.send(
            f"GET {PODS}/demo HTTP/1.1\r\nHost: x\r\nBad Header: x\r\n\r\n".encode(),
            get(tunnel, f"{PODS}/demo"),  # never served: the stream cannot be trusted
        )
        reply = await connection.reply()
        assert reply.status == 400
        assert reply.header("connection") == "close"
        assert b"header" in reply.body
        assert await connection.closed()
    assert not [e for e in tunnel.stub.requests if e.path.endswith("/pods/demo")]
    assert_closed_as_designed(caplog)


async def test_a_malformed_request_line_is_answered_400_and_the_connection_closed(
    tunnel: Tunnel, caplog: pytest.LogCaptureFixture
) -> None:
    async with caller(tunnel.server) as connection:
        connection.send(f"GET  {PODS}/demo HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        reply = await connection.reply()
        assert reply.status == 400
        assert reply.header("connection") == "close"
        assert await connection.closed()
    assert_closed_as_designed(caplog)


async def test_a_head_without_its_blank_line_past_64_kib_is_answered_431_and_closed(
    tunnel: Tunnel,
) -> None:
    start = f"GET {PODS}/demo HTTP/1.1\r\nX-Fill: ".encode()
    async with caller(tunnel.server) as connection:
        connection.send(start + b"a" * (MAX_HEAD + 1 - len(start)))
        reply = await connection.reply()
        assert reply.status == 431
        assert reply.header("connection") == "close"
        assert await connection.closed()


async def test_a_complete_head_over_64_kib_is_answered_431_and_closed(
    tunnel: Tunnel, caplog: pytest.LogCaptureFixture
) -> None:
    start = f"GET {PODS}/demo HTTP/1.1\r\nX-Fill: ".encode()
    async with caller(tunnel.server) as connection:
        connection.send(start + b"a" * (MAX_HEAD + 1 - len(start)) + b"\r\n\r\n")
        reply = await connection.reply()
        assert reply.status == 431
        assert await connection.closed()
    assert_closed_as_designed(caplog)


async def test_a_head_between_32_and_64_kib_is_answered_431_not_503(tunnel: Tunnel) -> None:
    """Too large for the tunnel's OPEN frame (32 KiB), not for the front door (64 KiB)."""
    async with caller(tunnel.server) as connection:
        connection.send(get(tunnel, f"{PODS}/demo", "X-Fill: " + "a" * 40 * 1024))
        reply = await connection.reply()
        assert_status_object(reply, 431, "RequestHeaderFieldsTooLarge")
        assert reply.header("retry-after") is None  # the same request fails the same way
    assert not [e for e in tunnel.stub.requests if e.path.endswith("/pods/demo")]


async def test_a_utf8_header_value_reaches_the_api_server_intact(tunnel: Tunnel) -> None:
    """kubectl --as=josé: the API server sees tunnel:josé, not its bytes read as latin-1."""
    status, answer = await tunnel.server.api(
        "PUT", "/api/v1/grants/alice/prod-eu", {"impersonate": True}
    )
    assert status == 200, answer
    async with caller(tunnel.server) as connection:
        connection.send(get(tunnel, f"{PODS}/demo", "Impersonate-User: josé"))
        reply = await connection.reply()
        assert reply.status == 200, reply.body[:300]
    (seen,) = [e for e in tunnel.stub.requests if e.path.endswith("/pods/demo")]
    assert seen.header("Impersonate-User") == "tunnel:josé"


async def test_a_header_value_that_is_not_utf8_is_answered_400_and_closed(
    tunnel: Tunnel,
) -> None:
    status, answer = await tunnel.server.api(
        "PUT", "/api/v1/grants/alice/prod-eu", {"impersonate": True}
    )
    assert status == 200, answer
    utf8 = get(tunnel, f"{PODS}/demo", "Impersonate-User: josé")
    latin1 = utf8.replace("é".encode(), b"\xe9")
    assert latin1 != utf8
    async with caller(tunnel.server) as connection:
        connection.send(latin1)
        reply = await connection.reply()
        assert reply.status == 400
        assert reply.header("connection") == "close"
        assert b"UTF-8" in reply.body
        assert await connection.closed()
    assert not [e for e in tunnel.stub.requests if e.path.endswith("/pods/demo")]


# ------------------------------------------------------------- handing over


async def test_a_request_after_a_lean_one_is_handed_to_aiohttp_with_its_bytes(
    tunnel: Tunnel,
) -> None:
    async with caller(tunnel.server) as connection:
        connection.send(get(tunnel, f"{PODS}/demo"))
        lean = await connection.reply()
        assert lean.json()["metadata"]["name"] == "demo"
        assert len(doors(tunnel.server).open) == 1
        connection.send(request("GET", "/healthz", None))
        health = await connection.reply()
        assert (health.status, health.json()) == (200, {"status": "ok"})
        assert doors(tunnel.server).open == set()  # the connection is aiohttp's now
        # ... for that one request (app.py, _say_close).
        assert health.header("connection") == "close"
        assert await connection.closed()


async def test_a_pipelined_request_for_aiohttp_is_handed_over_with_the_buffered_bytes(
    tunnel: Tunnel,
) -> None:
    async with caller(tunnel.server) as connection:
        connection.send(
            get(tunnel, f"{PODS}/demo"),
            request("GET", "/api/v1/clusters/prod-eu", tunnel.server.admin_token),
            request("GET", "/healthz", None),
        )
        lean = await connection.reply()
        cluster = await connection.reply()
        assert lean.json()["metadata"]["name"] == "demo"
        assert cluster.status == 200
        assert cluster.json()["name"] == "prod-eu"
        assert doors(tunnel.server).open == set()
        # An API client's connection stays open (app.py, _say_close) ...
        assert cluster.header("connection") is None
        health = await connection.reply()
        # ... and serves the next request, after which a probe's closes.
        assert (health.status, health.header("connection")) == (200, "close")
        assert await connection.closed()


async def test_an_api_clients_connection_serves_its_requests_one_after_another(
    tunnel: Tunnel,
) -> None:
    """A program driving the REST API pays one handshake, not one per request."""
    token = tunnel.server.admin_token
    async with caller(tunnel.server) as connection:
        for _ in range(3):
            connection.send(request("GET", "/api/v1/clusters/prod-eu", token))
            reply = await connection.reply()
            assert (reply.status, reply.header("connection")) == (200, None)
        connection.send(request("GET", "/api/v1/clusters/prod-eu", "not-a-token"))
        refused = await connection.reply()
        # A token refused closes it, as any request without one does.
        assert (refused.status, refused.header("connection")) == (401, "close")
        assert await connection.closed()


async def test_a_first_request_that_is_not_a_proxy_path_goes_to_aiohttp(tunnel: Tunnel) -> None:
    async with caller(tunnel.server) as connection:
        connection.send(request("GET", "/healthz", None))
        health = await connection.reply()
        assert (health.status, health.json()) == (200, {"status": "ok"})
        assert doors(tunnel.server).open == set()


async def test_a_chunked_request_body_is_handed_to_aiohttp_and_reaches_the_api_server(
    tunnel: Tunnel,
) -> None:
    body = json.dumps(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "chunked"}, "data": {}}
    ).encode()
    async with caller(tunnel.server) as connection:
        connection.send(
            request(
                "POST",
                f"{PREFIX}/api/v1/namespaces/default/configmaps",
                tunnel.alice_token,
                "Content-Type: application/json",
                "Transfer-Encoding: chunked",
            )
            + chunk(body[:10])
            + chunk(body[10:])
            + b"0\r\n\r\n"
        )
        created = await connection.reply()
        assert created.status == 201, created.body[:300]
        assert doors(tunnel.server).open == set()
    assert tunnel.stub.get("v1", "ConfigMap", "chunked", "default") is not None


async def test_expect_100_continue_is_handed_to_aiohttp_and_answered(tunnel: Tunnel) -> None:
    body = json.dumps(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "expected"}, "data": {}}
    ).encode()
    head, _, _ = request(
        "POST",
        f"{PREFIX}/api/v1/namespaces/default/configmaps",
        tunnel.alice_token,
        "Content-Type: application/json",
        "Expect: 100-continue",
        body=body,
    ).partition(b"\r\n\r\n")
    async with caller(tunnel.server) as connection:
        connection.send(head + b"\r\n\r\n")
        go_on = await asyncio.wait_for(connection.reader.readuntil(b"\r\n\r\n"), ANSWER_TIMEOUT)
        assert go_on.startswith(b"HTTP/1.1 100 ")
        connection.send(body)
        created = await connection.reply()
        assert created.status == 201, created.body[:300]
        assert doors(tunnel.server).open == set()


async def test_an_http10_request_is_handed_to_aiohttp_and_answered(tunnel: Tunnel) -> None:
    async with caller(tunnel.server) as connection:
        token = tunnel.alice_token
        connection.send(
            f"GET {PODS}/demo HTTP/1.0\r\nAuthorization: Bearer {token}\r\n\r\n".encode()
        )
        reply = await connection.reply(version="HTTP/1.0")
        assert reply.status == 200
        assert reply.json()["metadata"]["name"] == "demo"
        assert doors(tunnel.server).open == set()
        assert await connection.closed()  # HTTP/1.0 without keep-alive


async def test_an_upgrade_is_handed_to_aiohttp_and_relayed(tunnel: Tunnel) -> None:
    """A WebSocket exec: the 101, then the command's output as WebSocket frames."""
    target = f"{PODS}/demo/exec?command=echo&command=hi&stdout=true"
    async with caller(tunnel.server) as connection:
        connection.send(
            get(
                tunnel,
                target,
                "Connection: Upgrade",
                "Upgrade: websocket",
                "Sec-WebSocket-Version: 13",
                "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
                "Sec-WebSocket-Protocol: v4.channel.k8s.io",
            )
        )
        head = await asyncio.wait_for(connection.reader.readuntil(b"\r\n\r\n"), ANSWER_TIMEOUT)
        assert head.startswith(b"HTTP/1.1 101 "), head
        assert doors(tunnel.server).open == set()
        frames = [await asyncio.wait_for(ws_frame(connection.reader), ANSWER_TIMEOUT)]
        while frames[-1][0] != 0x8:  # until the close frame
            frames.append(await asyncio.wait_for(ws_frame(connection.reader), ANSWER_TIMEOUT))
        assert (0x2, b"\x01hi\n") in frames  # binary, channel 1 (stdout)


async def ws_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One unmasked WebSocket frame from the server: its opcode and payload."""
    first, second = await reader.readexactly(2)
    assert not second & 0x80, "a server frame must not be masked"
    length = second & 0x7F
    if length == 126:
        length = int.from_bytes(await reader.readexactly(2), "big")
    elif length == 127:
        length = int.from_bytes(await reader.readexactly(8), "big")
    return first & 0x0F, await reader.readexactly(length)


async def test_an_unknown_method_goes_to_aiohttp_and_is_answered(tunnel: Tunnel) -> None:
    async with caller(tunnel.server) as connection:
        connection.send(request("BREW", f"{PODS}/demo", tunnel.alice_token))
        # aiohttp's parser knows no BREW: it answers 400, as HTTP/1.0.
        reply = await connection.reply(version="HTTP/1.0")
        assert reply.status == 400
        assert doors(tunnel.server).open == set()


async def test_a_malformed_cluster_name_goes_to_aiohttp_and_is_answered(tunnel: Tunnel) -> None:
    async with caller(tunnel.server) as connection:
        connection.send(get(tunnel, "/k8s/clusters/Prod_EU/api/v1/namespaces"))
        reply = await connection.reply()
        assert_status_object(reply, 403, "Forbidden")  # aiohttp's route: no such grant
        assert doors(tunnel.server).open == set()


# ---------------------------------------------------------------- refusals


async def test_no_token_is_answered_401_as_a_status_and_the_connection_kept(
    tunnel: Tunnel,
) -> None:
    async with caller(tunnel.server) as connection:
        connection.send(request("GET", f"{PODS}/demo", None))
        refused = await connection.reply()
        assert_status_object(refused, 401, "Unauthorized")
        assert refused.header("connection") is None
        connection.send(get(tunnel, f"{PODS}/demo"))
        assert (await connection.reply()).status == 200


async def test_a_refusal_before_the_whole_body_came_announces_the_close(
    tunnel: Tunnel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rest of the body is still on the wire: the server closes, and says so."""
    # The caller never sends the rest: do not wait out the whole linger.
    monkeypatch.setattr(frontdoor, "LINGER_SECONDS", 0.2)
    async with caller(tunnel.server) as connection:
        connection.send(
            f"POST {PREFIX}/api/v1/namespaces/default/configmaps HTTP/1.1\r\n"
            'Host: x\r\nContent-Length: 100\r\n\r\n{"kind":'.encode()
        )
        refused = await connection.reply()
        assert_status_object(refused, 401, "Unauthorized")
        assert await connection.closed()
        assert refused.header("connection") == "close"


async def test_a_cluster_without_a_grant_is_answered_403(tunnel: Tunnel) -> None:
    await tunnel.server.add_cluster("staging")
    async with caller(tunnel.server) as connection:
        connection.send(get(tunnel, "/k8s/clusters/staging/api/v1/namespaces"))
        reply = await connection.reply()
        assert_status_object(reply, 403, "Forbidden")
        assert "alice" in reply.json()["message"]


async def test_a_store_failure_while_authenticating_is_answered_503_and_the_connection_kept(
    tunnel: Tunnel, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def unreadable(token_hash: str) -> tuple[float, User | None]:
        raise StoreError("the state store is locked")

    monkeypatch.setattr(tunnel.server.context.access, "lookup_user_by_hash", unreadable)
    async with caller(tunnel.server) as connection:
        connection.send(get(tunnel, f"{PODS}/demo"))
        refused = await connection.reply()
        assert_status_object(refused, 503, "ServiceUnavailable")
        assert refused.header("retry-after") == "1"
        assert refused.header("connection") is None
        # The store is back: the same connection serves the next request.
        monkeypatch.undo()
        connection.send(get(tunnel, f"{PODS}/demo"))
        assert (await connection.reply()).json()["metadata"]["name"] == "demo"


async def test_an_agent_never_seen_is_answered_503_at_once_and_not_worth_a_retry(
    tunnel: Tunnel,
) -> None:
    await tunnel.server.add_cluster("offline")
    await grant_alice(tunnel.server, "offline")
    async with caller(tunnel.server) as connection:
        started = time.monotonic()
        connection.send(get(tunnel, "/k8s/clusters/offline/api/v1/namespaces"))
        reply = await connection.reply()
        elapsed = time.monotonic() - started
        assert_status_object(reply, 503, "ServiceUnavailable")
        assert reply.json()["message"] == "cluster offline is not connected (its agent is offline)"
        # Without Retry-After kubectl reports it at once, instead of retrying for 10 s.
        assert reply.header("retry-after") is None
        assert elapsed < 2.0  # no waiting for an agent that may never come
