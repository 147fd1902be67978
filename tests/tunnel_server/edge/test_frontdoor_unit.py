"""The lean front end's FrontDoor alone, on a fake transport: what no socket shows exactly."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import uvloop
from aiohttp import web

from tunnel_server.edge.buffers import JOIN_LIMIT, AnswerOutput
from tunnel_server.edge.callerlimit import CountedProtocol
from tunnel_server.edge.frontdoor import FrontDoor, FrontDoors

HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


class FakeTransport(asyncio.Transport):
    """A plain (not TLS) transport that records what is done to it."""

    def __init__(self) -> None:
        super().__init__()
        self.protocol: asyncio.BaseProtocol | None = None
        self.written = bytearray()
        #: Each write() as bytes, each writelines() as its list of parts.
        self.writes: list[bytes | list[bytes]] = []
        self.closing = False
        self.reading = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self.protocol is not None
        return self.protocol

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data
        self.writes.append(bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        parts = [bytes(part) for part in list_of_data]
        self.written += b"".join(parts)
        self.writes.append(parts)

    def is_reading(self) -> bool:
        return self.reading

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


class FakeAiohttp(asyncio.Protocol):
    """Stands for aiohttp's protocol: records the calls it gets, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.received = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.calls.append("connection_made")

    def pause_writing(self) -> None:
        self.calls.append("pause_writing")

    def resume_writing(self) -> None:
        self.calls.append("resume_writing")

    def data_received(self, data: bytes) -> None:
        self.calls.append("data_received")
        self.received += data


def handed_to(transport: FakeTransport) -> asyncio.BaseProtocol:
    """The protocol a caller's connection was handed to (counted until it closes)."""
    protocol = transport.protocol
    assert isinstance(protocol, CountedProtocol)
    return protocol.inner


def front_door() -> tuple[FrontDoor, FakeTransport, FakeAiohttp, FrontDoors]:
    """A FrontDoor connected to a fake transport; its hand-over target is a FakeAiohttp."""
    aiohttp = FakeAiohttp()
    doors = FrontDoors()
    door = FrontDoor(web.Application(), lambda: aiohttp, doors)
    transport = FakeTransport()
    door.connection_made(transport)
    return door, transport, aiohttp, doors


async def test_a_request_that_comes_while_writes_are_paused_waits_for_them() -> None:
    """A caller not reading its answers gets no new request started, not even aiohttp's."""
    door, transport, aiohttp, doors = front_door()
    door.pause_writing()
    door.data_received(HEALTHZ)
    assert transport.protocol is None
    assert doors.open == {door}
    door.resume_writing()
    assert handed_to(transport) is aiohttp
    assert doors.open == set()
    assert aiohttp.calls == ["connection_made", "data_received"]
    assert bytes(aiohttp.received) == HEALTHZ


async def test_a_connection_handed_over_after_writes_resumed_does_not_pause_aiohttps_protocol() -> (
    None
):
    door, transport, aiohttp, _ = front_door()
    door.pause_writing()
    door.resume_writing()
    door.data_received(HEALTHZ)
    assert handed_to(transport) is aiohttp
    assert aiohttp.calls == ["connection_made", "data_received"]


async def test_a_small_answer_gathered_goes_out_in_one_write() -> None:
    """Head, body and last chunk: one TLS record and one system call, not three."""
    transport = FakeTransport()
    out = AnswerOutput(transport.write, transport.writelines)
    for part in (b"HTTP/1.1 200 OK\r\n\r\n", b"5\r\nhello\r\n", b"0\r\n\r\n"):
        out.add(part)
    out.flush()
    assert transport.writes == [b"HTTP/1.1 200 OK\r\n\r\n5\r\nhello\r\n0\r\n\r\n"]
    assert out.size == 0
    out.flush()  # nothing pending: nothing written
    assert len(transport.writes) == 1


async def test_large_gathered_parts_are_written_without_joining_them() -> None:
    transport = FakeTransport()
    out = AnswerOutput(transport.write, transport.writelines)
    parts = [b"h" * 100, b"x" * JOIN_LIMIT]
    for part in parts:
        out.add(part)
    out.flush()
    assert transport.writes == [parts]


async def test_a_single_gathered_part_is_written_as_it_is() -> None:
    transport = FakeTransport()
    out = AnswerOutput(transport.write, transport.writelines)
    out.add(b"x" * (2 * JOIN_LIMIT))
    out.flush()
    assert transport.writes == [b"x" * (2 * JOIN_LIMIT)]


class ClosingTransport(FakeTransport):
    """A fake transport that says when it is closed."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = asyncio.Event()

    def close(self) -> None:
        super().close()
        self.closed.set()


def test_an_idle_timer_fires_once_per_deadline_on_uvloop_whose_clock_keeps_milliseconds() -> None:
    """uvloop may fire a timer up to 1 ms before its deadline: that must close, not spin."""

    async def fires_per_deadline() -> int:
        worst = 0
        for i in range(50):
            # Timeouts off the millisecond grid, as real deadlines are.
            timeout = 0.0103 + 0.0001 * (i % 10)
            door = FrontDoor(
                web.Application(), FakeAiohttp, FrontDoors(), keepalive_timeout=timeout
            )
            fires = 0
            idle_timeout = door._idle_timeout

            def counted(idle_timeout: Callable[[], None] = idle_timeout) -> None:
                nonlocal fires
                fires += 1
                idle_timeout()

            door._idle_timeout = counted  # type: ignore[method-assign]
            transport = ClosingTransport()
            door.connection_made(transport)  # arms the idle timer
            await asyncio.wait_for(transport.closed.wait(), 5)
            worst = max(worst, fires)
        return worst

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(fires_per_deadline()) == 1
