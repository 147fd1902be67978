"""A burst's frames go in batches as they gather, not all after the burst (Session.send_if_due)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from protocol import Connection, Side
from tunnel_mux import MuxStream, Session

from ..support import until
from .memory import transport_pair
from .test_session import Pair, echo, session_pair

#: Three OPENs with these headers fill a message.
BIG = {"pad": "x" * 20_000}


@asynccontextmanager
async def quiet_pair() -> AsyncIterator[tuple[Pair, list[int]]]:
    """Sessions whose every send waits until the peer has read it (depth 0), batches of 2.

    Also the ids of the streams the peer has opened.

    Quiet before it yields: nothing unread, nobody sending (the handshake's PING and PONG).
    """
    opened: list[int] = []

    async def count(stream: MuxStream) -> None:
        opened.append(stream.id)

    async with session_pair(count, batch_frames=2, depth=0) as pair:
        await until(lambda: pair.server_transport.unread == pair.client_transport.unread == 0)
        await until(lambda: not pair.server.sending)
        yield pair, opened


async def test_frames_below_a_batch_wait_for_the_writer() -> None:
    async with session_pair(echo, batch_frames=4) as pair:
        before = pair.server_transport.sent
        for _ in range(3):
            pair.server.open_stream("http", end_stream=True)

        await pair.server.send_if_due()

        assert pair.server_transport.sent == before
        await until(lambda: pair.server_transport.sent == before + 1)  # the writer's, later
        assert pair.server.batches_sent_early == 0


async def test_a_batch_is_sent_by_the_task_that_completed_it_at_once() -> None:
    opened: list[int] = []

    async def count(stream: MuxStream) -> None:
        opened.append(stream.id)

    async with session_pair(count, batch_frames=4) as pair:
        before = pair.server_transport.sent
        ids = [pair.server.open_stream("http", end_stream=True).id for _ in range(4)]

        await pair.server.send_if_due()

        # In one message, before this task gave the writer a turn.
        assert pair.server_transport.sent == before + 1
        await until(lambda: len(opened) == 4)
        assert opened == ids


async def test_frames_keep_their_order_when_many_tasks_send_batches_under_backpressure() -> None:
    async with session_pair(echo, batch_frames=2, depth=1) as pair:

        async def exchange(number: int) -> bytes:
            stream = pair.server.open_stream("http")
            await pair.server.send_if_due()
            for part in range(10):
                await stream.write(f"{number}:{part};".encode())
            stream.end()
            return await stream.read_all(limit=1024)

        answers = await asyncio.gather(*(exchange(number) for number in range(50)))

        expected = [b"".join(f"{n}:{p};".encode() for p in range(10)) for n in range(50)]
        assert answers == expected
        # Both ways of sending took part, under backpressure.
        assert pair.server.batches_sent_early + pair.client.batches_sent_early > 0
        assert pair.server_transport.waited + pair.client_transport.waited > 0


async def test_a_task_cancelled_while_its_batch_waits_for_room_loses_no_frame() -> None:
    async with quiet_pair() as (pair, opened):
        before = pair.server_transport.sent

        async def burst() -> None:
            for _ in range(8):  # three messages' worth
                pair.server.open_stream("http", BIG, end_stream=True)
            await pair.server.send_if_due()  # one message, then waits: nobody read it yet

        sender = asyncio.create_task(burst())
        await asyncio.sleep(0)  # one turn: the burst sends its first message, then waits
        assert pair.server_transport.sent == before + 1
        assert not sender.done()
        sender.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sender

        await until(lambda: len(opened) == 8)  # the rest went with the writer
        assert pair.server_transport.sent >= before + 3


async def test_a_task_sends_one_message_and_leaves_what_others_queued_to_the_writer() -> None:
    async with quiet_pair() as (pair, opened):
        before = pair.server_transport.sent
        sent_by_the_task: list[int] = []

        async def burst() -> None:
            for _ in range(2):
                pair.server.open_stream("http", BIG, end_stream=True)
            await pair.server.send_if_due()
            sent_by_the_task.append(pair.server_transport.sent - before)

        sender = asyncio.create_task(burst())
        await asyncio.sleep(0)  # one turn: the burst sends, then waits for the peer to read
        for _ in range(6):  # other streams queue two messages' worth meanwhile
            pair.server.open_stream("http", BIG, end_stream=True)
        await sender

        assert sent_by_the_task == [1]
        await until(lambda: len(opened) == 8)


async def test_a_batch_whose_sending_fails_ends_the_session() -> None:
    async with session_pair(echo, batch_frames=2) as pair:

        async def broken(message: bytes) -> None:
            raise ValueError("the socket's library failed")

        pair.server_transport.send = broken  # type: ignore[method-assign]
        for _ in range(2):
            pair.server.open_stream("http", end_stream=True)

        with pytest.raises(ValueError, match="library failed"):
            await pair.server.send_if_due()

        assert not pair.server.is_open
        assert pair.server.close_reason is not None
        assert "internal error" in pair.server.close_reason


def test_a_batch_must_hold_a_frame() -> None:
    async def build() -> None:
        transport, _ = transport_pair()
        with pytest.raises(ValueError, match="batch_frames"):
            Session(transport, Connection(Side.CLIENT), batch_frames=0)

    asyncio.run(build())
