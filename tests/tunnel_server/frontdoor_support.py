"""Helpers of the front door's tests: raw HTTP/1.1 callers over TLS, and checks."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, cast

import pytest

from tests.e2e.test_kubectl_tunnel import Tunnel
from tunnel_pki.tls import client_context, server_context
from tunnel_server.app import FRONT_DOORS
from tunnel_server.edge.callerlimit import DEFAULT_MAX_CALLER_CONNECTIONS
from tunnel_server.edge.frontdoor import KEEPALIVE_TIMEOUT, FrontDoor, FrontDoors

from ..integration.harness import RunningServer

PREFIX = "/k8s/clusters/prod-eu"
PODS = f"{PREFIX}/api/v1/namespaces/default/pods"
#: Bound on waiting for an answer that should come at once (a hang fails by name).
ANSWER_TIMEOUT = 10.0


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
        if head or reply.status in (204, 304) or reply.status < 200:
            return reply  # no body (below 200: an interim answer, the real one follows)
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


async def connect(
    server: RunningServer, port: int | None = None, source: str = "127.0.0.1"
) -> Caller:
    """A caller's TLS connection, from ``source`` (another loopback address is another caller)."""
    reader, writer = await asyncio.open_connection(
        "127.0.0.1",
        port or server.port,
        ssl=client_context(server.ca_pem),
        local_addr=(source, 0),
    )
    return Caller(reader, writer)


@contextlib.asynccontextmanager
async def caller(
    server: RunningServer, port: int | None = None, source: str = "127.0.0.1"
) -> AsyncIterator[Caller]:
    connection = await connect(server, port, source)
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


def open_doors(server: RunningServer) -> list[FrontDoor]:
    """The server's open front-door connections, for tests that look inside them."""
    return [cast(FrontDoor, door) for door in doors(server).open]


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


@contextlib.asynccontextmanager
async def lean_server(
    server: RunningServer,
    keepalive_timeout: float = KEEPALIVE_TIMEOUT,
    max_callers: int = DEFAULT_MAX_CALLER_CONNECTIONS,
    per_address: int | None = None,
) -> AsyncIterator[tuple[int, FrontDoors]]:
    """A second TLS port of ``server``'s app whose front doors use these settings.

    Without ``per_address``, one address may hold all ``max_callers``.
    """
    state = server.settings.state_dir
    ssl = server_context(
        (state / "server.crt").read_bytes(), (state / "server.key").read_bytes(), server.ca_pem
    )
    runner = server.runner
    front_doors = FrontDoors(max_callers, per_address or max_callers)

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


@contextlib.asynccontextmanager
async def watching(tunnel: Tunnel, port: int, source: str = "127.0.0.1") -> AsyncIterator[Caller]:
    """A caller whose connection serves a watch of the pods, its first event (demo) read."""
    async with caller(tunnel.server, port, source) as connection:
        connection.send(get(tunnel, f"{PODS}?watch=true"))
        head = await asyncio.wait_for(connection.reader.readuntil(b"\r\n\r\n"), ANSWER_TIMEOUT)
        assert head.startswith(b"HTTP/1.1 200 ")
        first = await asyncio.wait_for(connection.reader.readuntil(b"\n\r\n"), ANSWER_TIMEOUT)
        assert b'"demo"' in first
        yield connection
