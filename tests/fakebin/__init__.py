"""Fake ``helm`` and ``tofu`` executables for the executor tests, and helpers to use them.

Put :data:`FAKEBIN` first on a run's PATH (:func:`fake_environment`); each
call of a fake appends a JSON record to the file named by ``FAKEBIN_RECORD``
(:func:`records` reads them). See ``fakecommon.py`` for the settings that
make a fake fail or hang.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path
from typing import Any

__all__ = ["FAKEBIN", "fake_environment", "process_gone", "records", "wait_gone"]

FAKEBIN = Path(__file__).resolve().parent
_FAKES = ("helm", "tofu")


def _make_executable() -> None:
    """The fakes are committed executable; restore the bit if a checkout lost it."""
    for name in _FAKES:
        path = FAKEBIN / name
        mode = path.stat().st_mode
        if not mode & stat.S_IXUSR:
            path.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def fake_environment(record: Path, *, fakes: bool = True, **settings: str) -> dict[str, str]:
    """A subprocess environment: the fakes first on PATH (if ``fakes``), the record, settings."""
    _make_executable()
    path = os.environ.get("PATH", os.defpath)
    return {
        "PATH": f"{FAKEBIN}{os.pathsep}{path}" if fakes else path,
        "HOME": str(record.parent),
        "FAKEBIN_RECORD": str(record),
        **settings,
    }


def records(record: Path) -> list[dict[str, Any]]:
    """Every call the fakes recorded, in order."""
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text().splitlines() if line.strip()]


def process_gone(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie no one reaped yet counts as ended)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return status.rpartition(")")[2].split()[0] in ("Z", "X")


async def wait_gone(pid: int, *, within: float = 10.0) -> bool:
    """Whether ``pid`` (any process, not only a child) ends within ``within`` seconds.

    A SIGKILL sent to a process group takes effect when each member next
    runs, so a grandchild may outlive the kill by a moment; this waits for its
    exit as an event (a pidfd becomes readable), not by polling.
    """
    try:
        descriptor = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    loop = asyncio.get_running_loop()
    exited: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not exited.done():
            exited.set_result(None)

    loop.add_reader(descriptor, readable)
    try:
        async with asyncio.timeout(within):
            await exited
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(descriptor)
        os.close(descriptor)
    return True
