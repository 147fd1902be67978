"""The lean HTTP/1.1 front end, byte for byte, on a real server with real TLS.

Each test speaks raw HTTP/1.1 over an asyncio TLS stream (trusting the
server's CA) so it controls the bytes exactly: keep-alive and pipelining,
response framing, request bodies, the hand-over to aiohttp at a request
boundary, refusals, and how connections end. Behind the server is a real
agent relaying to the Kubernetes API stand-in (the e2e ``tunnel`` fixture);
a second, read-only agent answers uploads before reading their body.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
from tunnel_pki.tls import client_context, server_context
from tunnel_server import frontdoor
from tunnel_server.app import FRONT_DOORS
from tunnel_server.frontdoor import FrontDoor, FrontDoors
from tunnel_server.http1 import MAX_HEAD, chunk
from tunnel_server.store.base import StoreError, User

from ..integration.harness import RunningServer, agent_settings, running_agent
from ..support import until

# The stand-in API server behind a real agent, alice's user, grant and token:
# the e2e suite's fixtures, reused as they are.
server = kubectl_e2e.server
tunnel = kubectl_e2e.tunnel

PREFIX = "/k8s/clusters/prod-eu"
PODS = f"{PREFIX}/api/v1/namespaces/default/pods"
#: Bound on waiting for an answer that should come at once (a hang fails by name).
ANSWER_TIMEOUT = 10.0


# ------------------------------------------------------------------ helpers


@dataclass
class Reply:
    """One response as it came over the wire (a chunked body decoded)."""

    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        values = [value for key, value in self.headers if key == name]
        assert len(values) <= 1, f"{name} appears {len(values)} times"
        return values[0] if values else None

    def json(self) -> Any:
        return json.loads(self.body)


class Caller:
    """A raw HTTP/1.1 client on one TLS connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def send(self, *requests: bytes) -> None:
        """Write ``requests`` in one write (several make a pipeline)."""
        self.writer.write(b"".join(requests))

    async def reply(self, *, head: bool = False, version: str = "HTTP/1.1") -> Reply:
        """Read one response (``head``: the answer to a HEAD request, which has no body)."""
        return await asyncio.wait_for(self._reply(head, version), ANSWER_TIMEOUT)

    async def _reply(self, head: bool, expected_version: str) -> Reply:
        raw = await self.reader.readuntil(b"\r\n\r\n")
        status_line, *lines = raw[:-4].decode("latin-1").split("\r\n")
        version, status, reason = status_line.split(" ", 2)
        assert version == expected_version, status_line
        headers = []
        for line in lines:
            name, _, value = line.partition(":")
            headers.append((name.lower(), value.strip()))
        reply = Reply(int(status), reason, headers, b"")
        if head or reply.status in (204, 304):
            return reply
        encoding = reply.header("transfer-encoding")
        length = reply.header("content-length")
        if encoding is not None:
            assert encoding == "chunked", encoding
            assert length is None, "both Content-Length and Transfer-Encoding"
            body = bytearray()
            while True:
                size_line = await self.reader.readuntil(b"\r\n")
                size = int(size_line[:-2], 16)  # strict: no extensions expected
                data = await self.reader.readexactly(size + 2)
                assert data.endswith(b"\r\n"), "a chunk not followed by CRLF"
                if size == 0:
                    assert data == b"\r\n", "trailers after the last chunk"
                    break
                body += data[:-2]
            reply.body = bytes(body)
        elif length is not None:
            reply.body = await self.reader.readexactly(int(length))
        else:
            reply.body = await self.reader.read()
        return reply

    async def closed(self) -> bool:
        """Wait for the server to end the connection; True if it sent nothing more first."""
        return await asyncio.wait_for(self.reader.read(), ANSWER_TIMEOUT) == b""

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            await self.writer.wait_closed()


async def connect(server: RunningServer, port: int | None = None) -> Caller:
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port or server.port, ssl=client_context(server.ca_pem)
    )
    return Caller(reader, writer)


@contextlib.asynccontextmanager
async def caller(server: RunningServer, port: int | None = None) -> AsyncIterator[Caller]:
    connection = await connect(server, port)
    try:
        yield connection
    finally:
        await connection.close()


def request(
    method: str,
    target: str,
    token: str | None,
    *headers: str,
    body: bytes | None = None,
) -> bytes:
    """A request's bytes: Host, the bearer token (if any), ``headers``, the body."""
    lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1"]
    if token is not None:
        lines.append(f"Authorization: Bearer {token}")
    lines.extend(headers)
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


def get(tunnel: Tunnel, target: str, *headers: str) -> bytes:
    return request("GET", target, tunnel.alice_token, *headers)


def doors(server: RunningServer) -> FrontDoors:
    return server.runner.app[FRONT_DOORS]


def assert_status_object(reply: Reply, code: int, reason: str) -> None:
    """The answer is a Kubernetes Status with ``code``, as kubectl expects."""
    assert reply.status == code
    assert reply.header("content-type") == "application/json"
    status = reply.json()
    assert (status["kind"], status["apiVersion"], status["status"]) == ("Status", "v1", "Failure")
    assert (status["code"], status["reason"]) == (code, reason)


def assert_closed_as_designed(caplog: pytest.LogCaptureFixture) -> None:
    """No error was logged: the connection was closed, not torn down by a failing protocol."""
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def grant_alice(server: RunningServer, cluster: str) -> None:
    status, answer = await server.api("PUT", f"/api/v1/grants/alice/{cluster}", {})
    assert status == 200, answer


# ------------------------------------------------- keep-alive and pipelining


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
        return [len(door._buffer) for door in doors(server).open] == [count]

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
        # ... and aiohttp serves the proxy path on it from then on.
        connection.send(get(tunnel, f"{PODS}/demo"))
        assert (await connection.reply()).json()["metadata"]["name"] == "demo"


async def test_a_pipelined_request_for_aiohttp_is_handed_over_with_the_buffered_bytes(
    tunnel: Tunnel,
) -> None:
    async with caller(tunnel.server) as connection:
        connection.send(
            get(tunnel, f"{PODS}/demo"),
            request("GET", "/healthz", None),
            request("GET", "/api/v1/clusters/prod-eu", tunnel.server.admin_token),
        )
        lean = await connection.reply()
        health = await connection.reply()
        cluster = await connection.reply()
        assert lean.json()["metadata"]["name"] == "demo"
        assert (health.status, health.json()) == (200, {"status": "ok"})
        assert cluster.status == 200
        assert cluster.json()["name"] == "prod-eu"
        assert doors(tunnel.server).open == set()


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
    async def unreadable(token: str) -> User | None:
        raise StoreError("the state store is locked")

    monkeypatch.setattr(tunnel.server.context.access, "user_for_token", unreadable)
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


async def test_an_offline_agent_is_answered_503_with_retry_after_promptly(tunnel: Tunnel) -> None:
    await tunnel.server.add_cluster("offline")
    await grant_alice(tunnel.server, "offline")
    async with caller(tunnel.server) as connection:
        started = time.monotonic()
        connection.send(get(tunnel, "/k8s/clusters/offline/api/v1/namespaces"))
        reply = await connection.reply()
        elapsed = time.monotonic() - started
        assert_status_object(reply, 503, "ServiceUnavailable")
        assert reply.header("retry-after") == "1"
        assert elapsed < 2.0  # no waiting for an agent that may never come


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
        (door,) = doors(tunnel.server).open
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


@contextlib.asynccontextmanager
async def lean_server(
    server: RunningServer, keepalive_timeout: float
) -> AsyncIterator[tuple[int, FrontDoors]]:
    """A second TLS port of ``server``'s app whose front doors use ``keepalive_timeout``."""
    state = server.settings.state_dir
    ssl = server_context(
        (state / "server.crt").read_bytes(), (state / "server.key").read_bytes(), server.ca_pem
    )
    runner = server.runner
    front_doors = FrontDoors()

    def aiohttp_connection() -> asyncio.Protocol:
        assert runner.server is not None
        return runner.server()

    def front_door() -> asyncio.Protocol:
        return FrontDoor(
            runner.app, aiohttp_connection, front_doors, keepalive_timeout=keepalive_timeout
        )

    listening = await asyncio.get_running_loop().create_server(front_door, "127.0.0.1", 0, ssl=ssl)
    try:
        yield listening.sockets[0].getsockname()[1], front_doors
    finally:
        listening.close()
        await front_doors.close()
        await listening.wait_closed()


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
        caller(tunnel.server, port) as watching,
    ):
        watching.send(get(tunnel, f"{PODS}?watch=true"))
        head = await asyncio.wait_for(watching.reader.readuntil(b"\r\n\r\n"), ANSWER_TIMEOUT)
        assert head.startswith(b"HTTP/1.1 200 ")
        first = await asyncio.wait_for(watching.reader.readuntil(b"\n\r\n"), ANSWER_TIMEOUT)
        assert b'"demo"' in first
        async with caller(tunnel.server, port) as idle:
            # Its end shows a whole timeout has passed since the watch started.
            assert await idle.closed()
        tunnel.stub.add_pod("later")
        event = await asyncio.wait_for(watching.reader.readuntil(b"\n\r\n"), ANSWER_TIMEOUT)
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
        (door,) = doors(tunnel.server).open
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
