"""The REST API reads request bodies whole, bounded in size and in time (real server, TLS)."""

from __future__ import annotations

import pytest

from tunnel_server.api import httpjson

from ..tunnel_server.frontdoor_support import caller
from .harness import RunningServer


async def test_a_body_that_never_comes_is_answered_408_and_holds_nothing(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: a bootstrap announcing a body it never sent held its connection for ever."""
    monkeypatch.setattr(httpjson, "BODY_TIMEOUT", 0.2)
    async with caller(server) as connection:
        connection.send(
            b"POST /api/v1/bootstrap HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
        )
        reply = await connection.reply()
        assert reply.status == 408
        assert reply.json()["error"] == {
            "status": 408,
            "code": "request_timeout",
            "message": "the request body did not arrive within 0.2 s (1 bytes came)",
        }
        # After the answer, the rest of the body is read for a while (so the
        # close cannot destroy the answer), then the connection closes.
        assert await connection.closed()


async def test_a_body_in_many_pieces_is_read_whole(server: RunningServer) -> None:
    """A body is read to its end, not up to what the first read returned."""
    name = "a" * 40
    body = b'{"name": "' + name.encode() + b'"}'
    head = (
        f"POST /api/v1/clusters HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {server.admin_token}"
        f"\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    async with caller(server) as connection:
        connection.send(head)
        for byte in body:
            connection.send(bytes([byte]))
            await connection.writer.drain()
        reply = await connection.reply()
    assert reply.status == 201, reply.body
    assert reply.json()["cluster"]["name"] == name
