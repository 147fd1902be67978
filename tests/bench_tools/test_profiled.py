"""bench.profiled: a program profiled between SIGUSR1 and SIGUSR2, and only then.

The program under it is a small script driven over its stdin: each line asks
it to call a function N times, and it answers when done. A signal's Python
handler runs before the script reads its next line, so once the script has
answered the line sent after a signal, the signal's work is done: the tests
wait on answers, never on a sleep.
"""

from __future__ import annotations

import asyncio
import os
import pstats
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

PATIENCE = 10.0

_SCRIPT = """
import sys

def counted():
    pass

print("ready", flush=True)
for line in sys.stdin:
    for _ in range(int(line)):
        counted()
    print("done", flush=True)
"""


class Program:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    async def said(self) -> str:
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), PATIENCE)
        return line.decode().strip()

    async def call(self, times: int) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{times}\n".encode())
        await self.process.stdin.drain()
        assert await self.said() == "done"

    def signal(self, signum: int) -> None:
        os.kill(self.process.pid, signum)


@pytest.fixture
async def program(tmp_path: Path) -> AsyncIterator[Program]:
    script = tmp_path / "program.py"
    script.write_text(_SCRIPT)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.profiled",
        "--out",
        str(tmp_path / "out.prof"),
        "--",
        sys.executable,
        str(script),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    running = Program(process)
    try:
        assert await running.said() == "ready"
        yield running
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


def calls_of(path: Path, function: str) -> int:
    table = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    return sum(calls for (_, _, name), (_, calls, *_) in table.items() if name == function)


async def test_only_the_calls_between_the_two_signals_are_counted(
    program: Program, tmp_path: Path
) -> None:
    await program.call(50)  # before: not counted
    program.signal(signal.SIGUSR1)
    await program.call(100)
    program.signal(signal.SIGUSR2)
    await program.call(25)  # after: not counted; and SIGUSR2's handler has run
    assert calls_of(tmp_path / "out.prof", "counted") == 100


async def test_each_profile_starts_afresh(program: Program, tmp_path: Path) -> None:
    program.signal(signal.SIGUSR1)
    await program.call(100)
    program.signal(signal.SIGUSR2)
    await program.call(0)
    program.signal(signal.SIGUSR1)
    await program.call(7)
    program.signal(signal.SIGUSR2)
    await program.call(0)
    assert calls_of(tmp_path / "out.prof", "counted") == 7


async def test_no_profile_is_written_until_profiling_stops(
    program: Program, tmp_path: Path
) -> None:
    program.signal(signal.SIGUSR1)
    await program.call(10)
    assert not (tmp_path / "out.prof").exists()
