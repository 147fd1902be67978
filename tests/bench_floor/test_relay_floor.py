"""bench.relay_floor's framing and backpressure alone, with stand-in transports.

These drive one tunnel end (:class:`bench.relay_floor.Mux`): how frames split
anywhere are parsed, how a turn's frames leave in one write, and who stops
reading when a buffer is full (on loopback the kernel's socket buffers absorb
megabytes, so a real transfer does not reliably reach those states). Both
floors run as processes in test_floors.py.
"""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from bench.relay_floor import CLOSE, DATA, HEADER, OPEN, Mux, Stream
from tests.support import until

pytestmark = pytest.mark.timeout(30)


class FakeTransport:
    """Stands in for a transport: keeps what is written, and whether it reads."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.reading = True
        self.closed = False
        self.aborted = False

    def write(self, data: bytes | memoryview) -> None:
        self.writes.append(bytes(data))

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    @property
    def written(self) -> bytes:
        return b"".join(self.writes)


def frame(kind: int, sid: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, sid, len(payload)) + payload


def tunnel_end() -> tuple[Mux, FakeTransport]:
    """A near end of the tunnel (it opens streams, it does not accept them), connected."""
    mux, transport = Mux(), FakeTransport()
    mux.connection_made(cast(asyncio.Transport, transport))
    return mux, transport


def stream_of(mux: Mux, sid: int) -> tuple[Stream, FakeTransport]:
    stream, transport = Stream(mux, sid), FakeTransport()
    stream.connection_made(cast(asyncio.Transport, transport))
    return stream, transport


@pytest.mark.parametrize("piece", [1, 2, 8, 9, 10, 4096])
async def test_frames_split_anywhere_reach_their_streams_whole(piece: int) -> None:
    mux, _ = tunnel_end()
    _, first = stream_of(mux, 1)
    _, second = stream_of(mux, 2)
    wire = (
        frame(DATA, 1, b"hello ")
        + frame(DATA, 2, bytes(range(256)) * 4)
        + frame(DATA, 7, b"for a stream closed here: dropped")
        + frame(DATA, 1, b"")
        + frame(DATA, 1, b"world")
        + frame(CLOSE, 2)
    )
    for start in range(0, len(wire), piece):
        mux.data_received(wire[start : start + piece])
    assert first.written == b"hello world"
    assert second.written == bytes(range(256)) * 4
    assert (first.closed, second.closed) == (False, True)
    assert set(mux.streams) == {1}


async def test_a_stream_gone_mid_frame_gets_no_more_and_tells_the_other_end() -> None:
    mux, tunnel = tunnel_end()
    first, first_socket = stream_of(mux, 1)
    _, second_socket = stream_of(mux, 2)
    wire = frame(DATA, 1, b"a" * 100) + frame(DATA, 2, b"for the other stream")
    mux.data_received(wire[:50])
    first_socket.close()
    mux.data_received(wire[50:80])  # its socket is closing: nothing more is written to it
    first.connection_lost(None)
    mux.data_received(wire[80:])
    assert first_socket.written == b"a" * 41
    assert second_socket.written == b"for the other stream"
    await until(lambda: bool(tunnel.writes))
    assert tunnel.written.endswith(frame(CLOSE, 1))


async def test_a_turns_frames_leave_in_one_write() -> None:
    mux, tunnel = tunnel_end()
    stream, _ = stream_of(mux, 1)
    stream.data_received(b"GET / HTTP/1.1\r\n\r\n")
    stream.data_received(b"more")
    assert tunnel.writes == []
    await until(lambda: bool(tunnel.writes))
    assert tunnel.writes == [
        frame(OPEN, 1) + frame(DATA, 1, b"GET / HTTP/1.1\r\n\r\n") + frame(DATA, 1, b"more")
    ]


async def test_a_full_tunnel_stops_every_stream_reading_until_it_drains() -> None:
    mux, _ = tunnel_end()
    _, first = stream_of(mux, 1)
    mux.pause_writing()
    _, second = stream_of(mux, 2)  # connected while the tunnel is full: starts paused
    assert (first.reading, second.reading) == (False, False)
    mux.resume_writing()
    assert (first.reading, second.reading) == (True, True)


async def test_a_full_stream_stops_the_tunnel_reading_until_no_stream_is_full() -> None:
    mux, tunnel = tunnel_end()
    first, _ = stream_of(mux, 1)
    second, _ = stream_of(mux, 2)
    first.pause_writing()
    second.pause_writing()
    first.resume_writing()
    assert not tunnel.reading
    second.connection_lost(None)  # gone while full: no longer holds the tunnel
    assert tunnel.reading


async def test_a_frame_outside_the_protocol_closes_the_tunnel() -> None:
    mux, tunnel = tunnel_end()
    mux.data_received(frame(9, 1, b"?"))
    assert tunnel.aborted
