"""bench.traced: the points a program passes, timestamped between SIGUSR1 and SIGUSR2 only.

The program under it drives the real WebSocketTransport (over a stand-in
socket) as its stdin asks, and answers when done; as in test_profiled, a
signal's handler has run once the program answers the line sent after it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bench.bench_latency_path import PATH, STEP_NAMES, steps_of

from .wrapped import Program, wrapped

pytestmark = pytest.mark.timeout(30)

_SCRIPT = """
import asyncio, sys
import aiohttp
from tunnel_mux.websocket import WebSocketTransport

class Socket:
    closed = False
    async def send_bytes(self, data, compress=None):
        pass
    async def receive(self, timeout=None):
        return aiohttp.WSMessage(aiohttp.WSMsgType.BINARY, b"m", None)

async def exchange(times):
    transport = WebSocketTransport(Socket())
    for _ in range(times):
        await transport.send(b"m")
        await transport.receive()

print("ready", flush=True)
for line in sys.stdin:
    asyncio.run(exchange(int(line)))
    print("done", flush=True)
"""


def records(path: Path) -> list[tuple[int, str]]:
    lines = path.read_text().splitlines()
    return [(int(when), point) for when, point in (line.split() for line in lines)]


@pytest.fixture
async def program(tmp_path: Path) -> AsyncIterator[Program]:
    async with wrapped("bench.traced", _SCRIPT, tmp_path, tmp_path / "out.trace") as running:
        yield running


async def test_only_the_points_passed_between_the_signals_are_recorded(
    program: Program, tmp_path: Path
) -> None:
    await program.recorded_once(5, 3, 4)  # before and after: not recorded

    recorded = records(tmp_path / "out.trace")
    assert [point for _, point in recorded] == ["tunnel_send", "tunnel_sent", "tunnel_recv"] * 3
    times = [when for when, _ in recorded]
    assert times == sorted(times)


async def test_each_recording_starts_afresh(program: Program, tmp_path: Path) -> None:
    await program.recorded_twice(3, 1)

    assert len(records(tmp_path / "out.trace")) == 3


def request(start: int, step: int) -> list[tuple[int, str, str]]:
    """One request's records: its points ``step`` ns apart from ``start``."""
    return [(start + index * step, process, point) for index, (process, point) in enumerate(PATH)]


def test_a_request_s_steps_run_from_each_point_to_the_next_and_to_the_next_request() -> None:
    records = [
        *request(0, 1000),
        (9500, "server", "tunnel_send"),  # a PING's message between two requests: passed over
        *request(20_000, 3000),
        *request(60_000, 1000),  # only its start ends the one before
    ]

    traced, steps = steps_of(records)

    assert traced == 2
    assert [step.name for step in steps] == list(STEP_NAMES)
    # The medians of (1, 3) us for each step within a request; the last step
    # (caller_out to the next caller_in) lasted 11 and 13 us.
    assert [step.p50_us for step in steps] == [2.0] * 9 + [12.0]
    assert [step.p90_us for step in steps] == [3.0] * 9 + [13.0]


def test_a_request_whose_path_was_not_seen_whole_is_left_out() -> None:
    broken = [record for record in request(20_000, 1000) if record[1] != "agent"]
    records = [*request(0, 1000), *broken, *request(40_000, 1000), *request(60_000, 1000)]

    traced, steps = steps_of(records)

    assert traced == 2  # the first and third; the last has no next request to end it
    assert steps[-1].p50_us == 11.0  # 9,000 to 20,000 ns and 49,000 to 60,000 ns


_UPSTREAM_SCRIPT = """
import asyncio, sys
from tunnel_agent.upstream import UpstreamPool

ANSWER = b"HTTP/1.1 200 OK\\r\\ncontent-length: 2\\r\\n\\r\\nok"

async def serve(reader, writer):
    while await reader.readuntil(b"\\r\\n\\r\\n"):
        writer.write(ANSWER)

async def exchange(times):
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = UpstreamPool(f"http://127.0.0.1:{port}")
    for _ in range(times):
        with await pool.request("GET", "/api", []) as response:
            assert await response.read() == b"ok"
    await pool.close()
    server.close()

print("ready", flush=True)
for line in sys.stdin:
    asyncio.run(exchange(int(line)))
    print("done", flush=True)
"""


async def test_the_request_to_the_upstream_is_marked_as_it_is_written(tmp_path: Path) -> None:
    """Through the connection's transport: a compiled connection calls its own methods directly."""
    out = tmp_path / "out.trace"
    async with wrapped("bench.traced", _UPSTREAM_SCRIPT, tmp_path, out) as running:
        await running.recorded_once(2, 3, 2)

    points = [point for _, point in records(out)]
    assert points == ["upstream_out", "upstream_in"] * 3
