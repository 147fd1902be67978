"""The floor relays (bench.relay_floor, bench.mux_floor) as the benchmark runs them.

Near and far are processes on loopback with real TLS; the relay fixture runs
each test against both floors. Waiting is on what the processes say (near's
JSON lines), on reads and on events, each with a time limit; never on a sleep.
"""

from __future__ import annotations

import asyncio

import pytest

from .floors import BIG, CHUNK, PATIENCE, Relay, Upstream, answer, head, request

pytestmark = pytest.mark.timeout(30)


async def test_a_get_reaches_the_upstream_and_its_answer_comes_back_byte_for_byte(
    relay: Relay, upstream: Upstream
) -> None:
    reader, writer = await relay.connect()
    sent = request("/pod", "Accept: application/json")
    writer.write(sent)
    connection = await upstream.next_connection()
    expected = answer(b"/pod")
    assert await asyncio.wait_for(reader.readexactly(len(expected)), PATIENCE) == expected
    assert bytes(connection.received) == sent
    writer.close()


async def test_two_client_connections_are_two_streams_with_their_own_answers(
    relay: Relay, upstream: Upstream
) -> None:
    (reader_a, writer_a), (reader_b, writer_b) = await asyncio.gather(
        relay.connect(), relay.connect()
    )
    writer_a.write(request("/a"))
    writer_b.write(request("/b"))
    first, second = await upstream.next_connection(), await upstream.next_connection()
    assert first is not second
    got_b = await asyncio.wait_for(reader_b.readexactly(len(answer(b"/b"))), PATIENCE)
    got_a = await asyncio.wait_for(reader_a.readexactly(len(answer(b"/a"))), PATIENCE)
    assert (got_a, got_b) == (answer(b"/a"), answer(b"/b"))
    assert {bytes(first.received), bytes(second.received)} == {request("/a"), request("/b")}
    writer_a.close()
    writer_b.close()


async def test_a_4_mib_answer_arrives_whole_and_in_order(relay: Relay, upstream: Upstream) -> None:
    """Four times mux-relay's initial stream credit: there it arrives only if credit returns."""
    reader, writer = await relay.connect()
    writer.write(request("/big"))
    got_head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), PATIENCE)
    assert got_head == head(len(BIG))
    body = await asyncio.wait_for(reader.readexactly(len(BIG)), PATIENCE)
    assert body == BIG
    writer.close()


async def test_closing_the_client_closes_its_upstream_connection(
    relay: Relay, upstream: Upstream
) -> None:
    reader, writer = await relay.connect()
    writer.write(request("/pod"))
    connection = await upstream.next_connection()
    await asyncio.wait_for(reader.readexactly(len(answer(b"/pod"))), PATIENCE)
    assert not connection.closed.is_set()
    writer.close()
    await asyncio.wait_for(connection.closed.wait(), PATIENCE)


async def test_the_upstream_closing_ends_the_client_after_its_answer(
    relay: Relay, upstream: Upstream
) -> None:
    reader, writer = await relay.connect()
    writer.write(request("/last"))
    everything = await asyncio.wait_for(reader.read(), PATIENCE)  # to end of file
    assert everything == answer(b"/last", "Connection: close")
    writer.close()


async def test_both_ends_exit_cleanly_on_sigterm(relay: Relay) -> None:
    await relay.children.stop(relay.far)
    await relay.children.stop(relay.near)
    assert (relay.far.returncode, relay.near.returncode) == (0, 0)


async def test_the_far_end_exits_when_the_tunnel_closes(relay: Relay) -> None:
    await relay.children.stop(relay.near)
    assert relay.near.returncode == 0
    assert await asyncio.wait_for(relay.far.wait(), PATIENCE) == 1


async def test_a_client_leaving_mid_answer_closes_the_upstream_connection(
    relay: Relay, upstream: Upstream
) -> None:
    reader, writer = await relay.connect()
    writer.write(request("/big"))
    connection = await upstream.next_connection()
    await asyncio.wait_for(reader.readexactly(len(head(len(BIG))) + CHUNK), PATIENCE)
    writer.close()
    await asyncio.wait_for(connection.closed.wait(), PATIENCE)
