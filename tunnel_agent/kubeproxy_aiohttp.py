"""``http`` streams the agent relays through aiohttp's client: upgrades and HEAD.

Exec, attach and port-forward answer 101 and then carry the upgraded
connection's bytes, relayed unchanged both ways, half-close included. HEAD
goes here because llhttp, under the agent's own client
(:mod:`tunnel_agent.upstream`), cannot be told that its answer has no body.
Plain requests, nearly all of them, take that client (:mod:`tunnel_agent.kubeproxy`).

Neither kind carries a body (the agent refuses one that says it does), and
each goes over a connection of its own, closed after it: no answer read here
leaves a connection whose next request depends on how this one was framed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from typing import cast

import aiohttp

from protocol.http import RequestHead, encode_response_head
from tunnel_mux import MuxStream, SessionError
from tunnel_mux.upgraded import UpgradedReader

from .kubeapi import KubeApi

__all__ = ["DROPPED_RESPONSE_HEADERS", "relay_request", "relay_upgrade"]

#: Hop-by-hop headers of the API server's answer, never passed back.
DROPPED_RESPONSE_HEADERS = frozenset({"connection", "keep-alive", "transfer-encoding", "trailer"})


async def relay_request(
    api: KubeApi,
    requests: Counter[tuple[str, int]],
    stream: MuxStream,
    head: RequestHead,
    headers: list[tuple[str, str]],
) -> None:
    """Relay a request without a body (HEAD: llhttp cannot tell its answer has none)."""
    async with api.single_use_session.request(
        head.method,
        api.url(head.path),
        headers=headers,
        allow_redirects=False,
        compress=None,
    ) as response:
        requests[(head.method.lower(), response.status)] += 1
        await stream.write(
            encode_response_head(
                response.status, response.reason or "", _response_headers(response)
            )
        )
        async for chunk in response.content.iter_any():
            await stream.write(chunk)
    stream.end()


async def relay_upgrade(
    api: KubeApi,
    requests: Counter[tuple[str, int]],
    stream: MuxStream,
    head: RequestHead,
    headers: list[tuple[str, str]],
) -> None:
    """Relay an upgrade request; after a 101, the upgraded connection's bytes both ways."""
    response = await api.single_use_session.request(
        head.method,
        api.url(head.path),
        headers=headers,
        allow_redirects=False,
    )
    try:
        await stream.write(
            encode_response_head(
                response.status, response.reason or "", _response_headers(response)
            )
        )
        if response.status != 101:
            async for chunk in response.content.iter_any():
                await stream.write(chunk)
            stream.end()
            return
        connection = response.connection
        assert connection is not None
        assert connection.protocol is not None
        reader = UpgradedReader(connection.transport)
        connection.protocol.read_timeout = None
        connection.protocol.set_parser(reader, reader)
        transport = connection.transport
        assert transport is not None
        await _splice(stream, reader, transport)
    finally:
        response.close()


async def _splice(
    stream: MuxStream, reader: UpgradedReader, transport: asyncio.BaseTransport
) -> None:
    """Relay bytes between the stream and the API server's upgraded connection."""
    # A cast, not an isinstance check: uvloop's transports are not subclasses
    # of asyncio's (an assert here broke exec and port-forward under uvloop).
    transport = cast(asyncio.WriteTransport, transport)

    async def to_api_server() -> None:
        while chunk := await stream.read():
            transport.write(chunk)
        if transport.can_write_eof():
            transport.write_eof()  # the caller half-closed (e.g. stdin EOF)

    async def to_caller() -> None:
        while chunk := await reader.read():
            await stream.write(chunk)
        stream.end()

    upward = asyncio.create_task(to_api_server())
    try:
        await to_caller()
    finally:
        upward.cancel()
        with contextlib.suppress(asyncio.CancelledError, SessionError, ConnectionError):
            await upward


def _response_headers(response: aiohttp.ClientResponse) -> list[tuple[str, str]]:
    # A 101 keeps Connection and Upgrade: they are what switches protocols.
    dropped = (
        DROPPED_RESPONSE_HEADERS - {"connection"}
        if response.status == 101
        else DROPPED_RESPONSE_HEADERS
    )
    headers = []
    for raw_name, raw_value in response.raw_headers:
        name = raw_name.decode("latin-1").lower()
        if name not in dropped:
            headers.append((name, raw_value.decode("latin-1")))
    return headers
