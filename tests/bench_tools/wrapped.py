"""A small script run under one of the benchmark's wrappers (bench.profiled, bench.traced).

The script reads a number per line on its stdin, does that much work, and
answers ``done``. A signal's Python handler runs before the script reads its
next line, so once the script has answered the line sent after a signal, the
signal's work is done: the tests wait on answers, never on a sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

PATIENCE = 10.0


class Program:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    async def said(self) -> str:
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), PATIENCE)
        return line.decode().strip()

    async def work(self, times: int) -> None:
        """Ask for ``times`` rounds of the script's work, and wait until they are done."""
        assert self.process.stdin is not None
        self.process.stdin.write(f"{times}\n".encode())
        await self.process.stdin.drain()
        assert await self.said() == "done"

    def signal(self, signum: int) -> None:
        os.kill(self.process.pid, signum)

    async def recorded_once(self, before: int, during: int, after: int) -> None:
        """Work ``before`` rounds, ``during`` between the two signals, ``after`` after them."""
        await self.work(before)
        self.signal(signal.SIGUSR1)
        await self.work(during)
        self.signal(signal.SIGUSR2)
        await self.work(after)  # and SIGUSR2's handler has run

    async def recorded_twice(self, first: int, second: int) -> None:
        """Work ``first`` rounds between the two signals, then ``second`` between them again."""
        for times in (first, second):
            self.signal(signal.SIGUSR1)
            await self.work(times)
            self.signal(signal.SIGUSR2)
            await self.work(0)  # SIGUSR2's handler has run


@contextlib.asynccontextmanager
async def wrapped(wrapper: str, script: str, tmp_path: Path, out: Path) -> AsyncIterator[Program]:
    """``script`` running under ``python -m <wrapper> --out <out>``, ready for work."""
    path = tmp_path / "program.py"
    path.write_text(script)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", wrapper, "--out", str(out), "--", sys.executable, str(path),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    running = Program(process)
    try:
        assert await running.said() == "ready"
        yield running
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()
