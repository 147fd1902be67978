"""Long pipelines on one caller connection: what the front door holds is bounded.

A caller may pipeline as many requests as it likes, and need not read the
answers. Refusals are answered without the agent (a 401 costs the server no
await), so these are the cheapest way to make the server work: the tests
pipeline requests without a token.
"""

from __future__ import annotations

import asyncio
import socket
from typing import cast

from tests.e2e import test_kubectl_tunnel as kubectl_e2e
from tests.e2e.test_kubectl_tunnel import Tunnel
from tunnel_pki.tls import client_context
from tunnel_server.edge.frontdoor import FrontDoor
from tunnel_server.edge.http1 import MAX_HEAD

from ...support import until
from ..frontdoor_support import PODS, Caller, assert_status_object, caller, open_doors, request

server = kubectl_e2e.server
tunnel = kubectl_e2e.tunnel

#: One request without a token: answered 401 at once.
NO_TOKEN = request("GET", PODS, None)
#: Requests in the long pipelines: megabytes of them, and of their answers.
PIPELINED = 40_000
#: More than the front door may hold of a connection's requests or answers.
BOUND = MAX_HEAD + 512 * 1024


class AnswerCounter:
    """Reads a connection's answers as they come, counting their status lines."""

    MARK = b"HTTP/1.1 401 "

    def __init__(self, connection: Caller) -> None:
        self.count = 0
        self._task = asyncio.create_task(self._read(connection.reader))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        tail = b""
        while chunk := await reader.read(1 << 20):
            data = tail + chunk
            self.count += data.count(self.MARK)
            tail = data[-(len(self.MARK) - 1) :]

    def stop(self) -> None:
        self._task.cancel()


async def the_door(tunnel: Tunnel) -> FrontDoor:
    """The one caller connection's front door, once the server has it."""
    await until(lambda: len(open_doors(tunnel.server)) == 1)
    (door,) = open_doors(tunnel.server)
    return door


async def test_a_long_pipeline_is_read_a_bounded_part_at_a_time(tunnel: Tunnel) -> None:
    async with caller(tunnel.server) as connection:
        answers = AnswerCounter(connection)
        try:
            connection.send(NO_TOKEN * PIPELINED)
            door = await the_door(tunnel)
            held: list[int] = []

            def all_answered() -> bool:
                held.append(len(door._buffer))
                return answers.count == PIPELINED

            await until(all_answered, max_turns=10**7)
        finally:
            answers.stop()
    # Every answer lets the server read on only while what it holds of the
    # pipeline is under MAX_HEAD; before, each one let one more read in, and
    # the whole pipeline (3 MB here) piled up in the buffer.
    assert max(held) < BOUND, f"{max(held):,} bytes of pipelined requests held"


async def non_reading_caller(tunnel: Tunnel) -> Caller:
    """A caller with a small receive buffer that reads none of its answers."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", tunnel.server.port))
    sock.setblocking(False)
    reader, writer = await asyncio.open_connection(
        sock=sock, ssl=client_context(tunnel.server.ca_pem), server_hostname="127.0.0.1"
    )
    cast(asyncio.Transport, writer.transport).pause_reading()
    return Caller(reader, writer)


async def test_a_caller_that_reads_no_answers_stops_the_pipeline_and_loses_none(
    tunnel: Tunnel,
) -> None:
    connection = await non_reading_caller(tunnel)
    try:
        connection.send(NO_TOKEN * PIPELINED)
        door = await the_door(tunnel)

        def stopped() -> bool:
            # Its answers wait for the caller, and so do its next requests.
            return door._writing_paused and door._reading_paused and door._task is None

        await until(stopped, max_turns=10**7)
        assert door._transport is not None
        held = door._transport.get_write_buffer_size()
        assert held < BOUND, f"{held:,} bytes of answers held for a caller that reads none"
        assert len(door._buffer) < BOUND
        # Before, refusals were written whatever the caller read, and the next
        # request started at once: the server held every answer (16 MB here).
        answers = AnswerCounter(connection)
        cast(asyncio.Transport, connection.writer.transport).resume_reading()
        try:
            await until(lambda: answers.count == PIPELINED, max_turns=10**7)
        finally:
            answers.stop()
    finally:
        connection.writer.transport.abort()


async def test_a_refused_head_request_gets_no_body(tunnel: Tunnel) -> None:
    async with caller(tunnel.server) as connection:
        connection.send(
            request("HEAD", f"{PODS}/demo", None),  # no token: 401
            request("GET", f"{PODS}/demo", tunnel.alice_token),
        )
        refused = await connection.reply(head=True)
        assert refused.status == 401
        assert refused.body == b""
        # Had the refusal's Status body followed its head, this would not parse.
        served = await connection.reply()
        assert served.status == 200
        assert served.json()["metadata"]["name"] == "demo"


async def test_a_refused_get_still_gets_its_status_body(tunnel: Tunnel) -> None:
    async with caller(tunnel.server) as connection:
        connection.send(request("GET", f"{PODS}/demo", None))
        assert_status_object(await connection.reply(), 401, "Unauthorized")


async def test_empty_lines_before_a_request_line_are_ignored(tunnel: Tunnel) -> None:
    # RFC 9112, 2.2: a server SHOULD ignore them. Old clients send one after a body.
    async with caller(tunnel.server) as connection:
        connection.send(b"\r\n\r\n" + request("GET", f"{PODS}/demo", tunnel.alice_token))
        first = await connection.reply()
        connection.send(b"\r\n" + request("GET", f"{PODS}/demo", None))
        second = await connection.reply()
    assert first.status == 200
    assert first.json()["metadata"]["name"] == "demo"
    assert_status_object(second, 401, "Unauthorized")
