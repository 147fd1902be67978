"""Sessions over an in-memory transport: streams, backpressure, isolation, shutdown."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from protocol import Connection, ErrorCode, Keepalive, Limits, Side
from tunnel_mux import (
    MuxStream,
    Session,
    SessionClosedError,
    SessionHandlers,
    SessionTimeoutError,
    StreamResetError,
)
from tunnel_mux.session import BATCH_FRAMES

from ..support import until
from .memory import MemoryTransport, transport_pair

Handler = Callable[[MuxStream], Awaitable[None]]


@dataclass
class Pair:
    client: Session
    server: Session
    client_transport: MemoryTransport
    server_transport: MemoryTransport


@asynccontextmanager
async def session_pair(
    on_stream: Handler | None = None,
    *,
    limits: Limits | None = None,
    keepalive: Keepalive | None = None,
    on_server_message: Callable[[str, dict[str, Any]], None] | None = None,
    batch_frames: int = BATCH_FRAMES,
    depth: int = 8,
) -> AsyncIterator[Pair]:
    """A client and a server session joined in memory, both running."""
    client_transport, server_transport = transport_pair(depth)
    client = Session(
        client_transport,
        Connection(Side.CLIENT, limits, keepalive=keepalive),
        handlers=SessionHandlers(on_stream=on_stream),
        label="client",
        batch_frames=batch_frames,
    )
    server = Session(
        server_transport,
        Connection(Side.SERVER, limits, keepalive=keepalive),
        handlers=SessionHandlers(on_message=on_server_message),
        label="server",
        batch_frames=batch_frames,
    )
    tasks = [asyncio.create_task(client.run()), asyncio.create_task(server.run())]
    try:
        await asyncio.gather(client.wait_ready(), server.wait_ready())
        yield Pair(client, server, client_transport, server_transport)
    finally:
        await server.close()
        await client.close()
        await asyncio.gather(*tasks)


async def echo(stream: MuxStream) -> None:
    while chunk := await stream.read():
        await stream.write(chunk)


async def test_stream_echoes_data_and_half_closes_both_ways() -> None:
    async with session_pair(echo) as pair:
        stream = pair.server.open_stream("http", {"path": "/"})
        payload = bytes(range(256)) * 4096  # 1 MiB, more than one window
        writer = asyncio.create_task(_write_and_end(stream, payload))
        received = await stream.read_all(limit=2 * len(payload))
        await writer
        assert received == payload
        assert stream.at_eof


async def _write_and_end(stream: MuxStream, data: bytes) -> None:
    await stream.write(data)
    stream.end()


async def test_peer_reset_fails_reader_with_code_and_reason() -> None:
    async def refuse(stream: MuxStream) -> None:
        stream.reset(0x101, "not allowed here")

    async with session_pair(refuse) as pair:
        stream = pair.server.open_stream("http")
        with pytest.raises(StreamResetError) as info:
            await stream.read()
        assert info.value.code == 0x101
        assert info.value.reason == "not allowed here"
        assert info.value.remote


async def test_stalled_reader_does_not_stall_other_streams() -> None:
    """One stream whose consumer never reads blocks only its own writer."""
    stalled_opened = asyncio.Event()

    async def handler(stream: MuxStream) -> None:
        if stream.kind == "stalled":
            stalled_opened.set()
            await asyncio.Event().wait()  # never reads
        await echo(stream)

    limits = Limits(initial_window=64 * 1024, max_send_buffer=64 * 1024)
    async with session_pair(handler, limits=limits) as pair:
        stalled = pair.server.open_stream("stalled")
        await stalled_opened.wait()
        # Fill the stalled stream's window and send buffer: its writer blocks.
        blocked_write = asyncio.create_task(stalled.write(b"x" * (1024 * 1024)))
        await until(lambda: pair.server.connection.send_window(stalled.id) == 0)
        assert not blocked_write.done()
        # Other streams still make progress, many windows' worth.
        for _ in range(3):
            other = pair.server.open_stream("echo")
            data = b"y" * (256 * 1024)
            writer = asyncio.create_task(_write_and_end(other, data))
            assert await other.read_all(limit=len(data)) == data
            await writer
        # Control frames still flow.
        assert await pair.server.ping() >= 0
        assert not blocked_write.done()
        stalled.reset()
        with pytest.raises(StreamResetError):
            await blocked_write


async def test_session_loss_fails_open_streams_promptly() -> None:
    async def hold(stream: MuxStream) -> None:
        await asyncio.Event().wait()

    async with session_pair(hold) as pair:
        stream = pair.server.open_stream("watch")
        reader = asyncio.create_task(stream.read())
        await pair.client_transport.close()
        with pytest.raises(SessionClosedError):
            await reader
        await pair.server.wait_closed()
        with pytest.raises(SessionClosedError):
            pair.server.open_stream("http")


async def test_shutdown_lets_open_streams_finish_and_refuses_new_ones() -> None:
    release = asyncio.Event()

    async def slow(stream: MuxStream) -> None:
        await release.wait()
        await stream.write(b"done")

    async with session_pair(slow) as pair:
        stream = pair.server.open_stream("http", end_stream=True)
        shutdown = asyncio.create_task(pair.server.shutdown(grace=30))
        await until(lambda: pair.server.connection.going_away)
        with pytest.raises(Exception, match="going away"):
            pair.server.open_stream("http")
        release.set()
        assert await stream.read_all(limit=100) == b"done"
        await shutdown
        assert pair.server.connection.closed


async def test_handler_that_returns_ends_its_stream() -> None:
    async def reply(stream: MuxStream) -> None:
        await stream.write(b"hello")

    async with session_pair(reply) as pair:
        stream = pair.server.open_stream("http", end_stream=True)
        assert await stream.read_all(limit=100) == b"hello"
        # Both directions ended: no stream is left on either side.
        await until(lambda: not pair.client.streams and not pair.server.streams)
        assert pair.client.connection.open_streams == 0
        assert pair.server.connection.open_streams == 0


async def test_failing_handler_resets_its_stream_with_internal_error() -> None:
    async def broken(stream: MuxStream) -> None:
        raise RuntimeError("boom")

    async with session_pair(broken) as pair:
        stream = pair.server.open_stream("http")
        with pytest.raises(StreamResetError) as info:
            await stream.read()
        assert info.value.code == ErrorCode.INTERNAL_ERROR


async def test_silent_peer_is_detected_by_keepalive() -> None:
    """A peer that stops answering is dropped after the keepalive deadline."""
    keepalive = Keepalive(interval=0.05, timeout=0.1)
    client_transport, server_transport = transport_pair()
    server = Session(server_transport, Connection(Side.SERVER, keepalive=keepalive))
    client_connection = Connection(Side.CLIENT)
    # The client answers the handshake once, then goes silent.
    for message in client_connection.data_to_send():
        await client_transport.send(message)
    run = asyncio.create_task(server.run())
    await server.wait_ready()
    stream = server.open_stream("watch")
    with pytest.raises(SessionClosedError, match="PING"):
        await stream.read()
    await run
    assert server.close_reason is not None


class ClosingForever(MemoryTransport):
    """A socket whose close waits for a peer that never answers (a dead link)."""

    closing: asyncio.Future[None]

    async def close(self, reason: str = "") -> None:
        self.closing = asyncio.get_running_loop().create_future()
        await asyncio.Event().wait()


async def test_close_returns_when_the_sessions_task_is_cancelled_during_its_tear_down() -> None:
    # The server's socket handler is cancelled when the connection drops while
    # the close waits for the peer: whoever waits in close() (an agent being
    # replaced, the server's shutdown) must not wait forever.
    client_transport, server_transport = transport_pair()
    transport = ClosingForever(server_transport._inbox, server_transport._outbox)
    server = Session(transport, Connection(Side.SERVER))
    client = Session(client_transport, Connection(Side.CLIENT))
    runs = [asyncio.create_task(server.run()), asyncio.create_task(client.run())]
    await server.wait_ready()
    closing = asyncio.create_task(server.close())
    await until(lambda: hasattr(transport, "closing"), max_turns=10_000)

    runs[0].cancel()

    await asyncio.wait_for(closing, 5)  # returns at once; without the fix, never
    assert server.close_reason is not None
    await client.close()
    await asyncio.gather(*runs, return_exceptions=True)


async def test_data_for_a_peer_gone_quiet_carries_a_ping_and_ends_the_session_when_unanswered() -> (
    None
):
    """An exec session idle for long, then a keystroke on a link gone dead: no 30 s wait."""
    hours = 0.0
    keepalive = Keepalive(interval=3600.0, timeout=3600.0, probe_after=1.0, probe_timeout=0.05)
    client_transport, server_transport = transport_pair()
    server = Session(
        server_transport,
        Connection(Side.SERVER, keepalive=keepalive),
        clock=lambda: time.monotonic() + hours,
    )
    client_connection = Connection(Side.CLIENT)
    # The client answers the handshake and takes the OPEN, then goes silent.
    for message in client_connection.data_to_send():
        await client_transport.send(message)
    run = asyncio.create_task(server.run())
    await server.wait_ready()
    stream = server.open_stream("exec")  # the peer was heard from just now: no PING
    last_received = server.connection._liveness.last_received
    assert last_received is not None
    assert server.connection.deadline() == pytest.approx(last_received + 3600.0)

    hours = 2 * 3600.0  # as the session's clock sees it, two idle hours pass
    await stream.write(b"ls\n")

    # The PING went with the keystroke, and its 0.05 s deadline woke the
    # session's timer, which slept towards the keepalive's hour.
    with pytest.raises(SessionTimeoutError, match=r"within 0\.05s"):
        await asyncio.wait_for(stream.read(), 10)
    await run


async def test_silent_for_counts_from_the_peers_last_message() -> None:
    later = 0.0
    client_transport, server_transport = transport_pair()
    server = Session(
        server_transport, Connection(Side.SERVER), clock=lambda: time.monotonic() + later
    )
    assert server.silent_for() is None  # nothing heard yet
    client_connection = Connection(Side.CLIENT)
    for message in client_connection.data_to_send():
        await client_transport.send(message)
    run = asyncio.create_task(server.run())
    await server.wait_ready()
    heard = server.silent_for()
    assert heard is not None
    assert heard < 60.0
    later = 3600.0  # as the session's clock sees it, an hour passes without a message
    silent = server.silent_for()
    assert silent is not None
    assert 3600.0 <= silent < 3660.0
    run.cancel()
    await asyncio.gather(run, return_exceptions=True)


async def test_read_ready_says_whether_read_would_answer_at_once() -> None:
    async def send_then_end(stream: MuxStream) -> None:
        await stream.write(b"hello")
        await stream.read()  # until the opener ends its side
        stream.end()

    async with session_pair(send_then_end) as pair:
        stream = pair.server.open_stream("http")
        assert not stream.read_ready  # nothing came yet: read() would wait
        await until(lambda: stream.read_ready, max_turns=10_000)
        assert await stream.read() == b"hello"
        assert not stream.read_ready
        stream.end()
        await until(lambda: stream.read_ready, max_turns=10_000)  # the end came
        assert await stream.read() == b""


async def test_a_second_reader_of_one_stream_is_refused_not_left_waiting() -> None:
    async def wait_for_end(stream: MuxStream) -> None:
        await stream.read()

    async with session_pair(wait_for_end) as pair:
        stream = pair.server.open_stream("http")
        first = asyncio.create_task(stream.read())
        await until(lambda: stream._readable._waiter is not None, max_turns=10_000)
        with pytest.raises(RuntimeError, match="already being read"):
            await stream.read()
        stream.end()
        assert await first == b""  # the handler returned: its end came to the first reader


async def test_a_reader_may_take_over_from_one_cancelled_before_it_ran_again() -> None:
    async def answer_later(stream: MuxStream) -> None:
        await stream.read()  # until the opener ends its side
        await stream.write(b"late")

    async with session_pair(answer_later) as pair:
        stream = pair.server.open_stream("http")
        first = asyncio.create_task(stream.read())
        await until(lambda: stream._readable._waiter is not None, max_turns=10_000)
        first.cancel()
        stream.end()
        # Read again at once, in this task: before the cancelled one has run.
        assert await stream.read() == b"late"
        with pytest.raises(asyncio.CancelledError):
            await first


async def test_each_side_measures_the_round_trip_once_the_handshake_completes() -> None:
    # Without any PING from the application: the smallest round trip sizes the
    # credit of streams that share the connection (docs/protocol.md).
    async with session_pair() as pair:
        await until(
            lambda: (
                pair.client.connection.min_rtt is not None
                and pair.server.connection.min_rtt is not None
            ),
            max_turns=10_000,
        )


async def test_a_goaway_in_the_hellos_message_ends_the_session_with_the_peers_reason() -> None:
    # The handshake PING must not be sent on a connection the GOAWAY already ended.
    peer = Connection(Side.SERVER)
    peer.goaway(ErrorCode.PROTOCOL_ERROR, "go away at once")
    [message] = peer.data_to_send()  # HELLO and GOAWAY together
    client_transport, server_transport = transport_pair()
    session = Session(client_transport, Connection(Side.CLIENT), label="client")
    run = asyncio.create_task(session.run())
    await server_transport.send(message)
    await run
    reason = "the peer closed the connection (PROTOCOL_ERROR): go away at once"
    assert session.close_reason == reason


async def test_a_message_queued_while_the_writer_is_sending_goes_out_without_another_kick() -> None:
    got: list[tuple[str, dict[str, Any]]] = []
    arrived = asyncio.Event()

    def on_message(kind: str, body: dict[str, Any]) -> None:
        got.append((kind, body))
        if len(got) == 2:
            arrived.set()

    async with session_pair(on_server_message=on_message) as pair:
        gate = asyncio.Event()
        sending = asyncio.Event()
        send = pair.client_transport.send

        async def held_send(message: bytes) -> None:
            sending.set()
            await gate.wait()
            await send(message)

        pair.client_transport.send = held_send  # type: ignore[method-assign]
        pair.client.send_message("first", {"n": 1})
        await sending.wait()  # the writer is inside send, holding the first message
        pair.client.send_message("second", {"n": 2})
        pair.client_transport.send = send  # type: ignore[method-assign]
        gate.set()
        await asyncio.wait_for(arrived.wait(), 5)
        assert got == [("first", {"n": 1}), ("second", {"n": 2})]
