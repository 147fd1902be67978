"""bench.profiled: a program profiled between SIGUSR1 and SIGUSR2, and only then.

The program under it is a small script driven over its stdin: each line asks
it to call a function N times, and it answers when done. A signal's Python
handler runs before the script reads its next line, so once the script has
answered the line sent after a signal, the signal's work is done: the tests
wait on answers, never on a sleep.
"""

from __future__ import annotations

import pstats
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from .wrapped import Program, wrapped

pytestmark = pytest.mark.timeout(30)

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


@pytest.fixture
async def program(tmp_path: Path) -> AsyncIterator[Program]:
    async with wrapped("bench.profiled", _SCRIPT, tmp_path, tmp_path / "out.prof") as running:
        yield running


def calls_of(path: Path, function: str) -> int:
    table = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    return sum(calls for (_, _, name), (_, calls, *_) in table.items() if name == function)


async def test_only_the_calls_between_the_two_signals_are_counted(
    program: Program, tmp_path: Path
) -> None:
    await program.recorded_once(50, 100, 25)  # before and after: not counted
    assert calls_of(tmp_path / "out.prof", "counted") == 100


async def test_each_profile_starts_afresh(program: Program, tmp_path: Path) -> None:
    await program.recorded_twice(100, 7)
    assert calls_of(tmp_path / "out.prof", "counted") == 7


async def test_no_profile_is_written_until_profiling_stops(
    program: Program, tmp_path: Path
) -> None:
    program.signal(signal.SIGUSR1)
    await program.work(10)
    assert not (tmp_path / "out.prof").exists()
