"""Child processes of the command benchmark: started, watched and always ended.

Every child is started through a tiny wrapper that sets ``PR_SET_PDEATHSIG``
(the child gets SIGKILL if the benchmark dies, even by SIGKILL) and then
``execv``'s the real program in its own session, so that a Ctrl-C reaches the
benchmark alone. The benchmark ends each child by its pid (SIGTERM, then
SIGKILL after a grace period) on success, failure, Ctrl-C and timeout alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from pathlib import Path

__all__ = [
    "REPO",
    "BenchError",
    "Children",
    "cpu_seconds",
    "free_port",
    "wait_port",
]

REPO = Path(__file__).resolve().parents[1]
_CLK_TCK = os.sysconf("SC_CLK_TCK")
_STOP_GRACE = 5.0
_LINE_LIMIT = 1024 * 1024

# Run by every child before it becomes the real program: die with the benchmark
# (PR_SET_PDEATHSIG = 1 survives execve), or exit if it is already gone.
_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(70)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


class BenchError(Exception):
    """The benchmark could not measure what it set out to; the message says why."""


def _environment() -> dict[str, str]:
    """The children's environment: this tree first on the import path."""
    environment = dict(os.environ)
    paths = [str(REPO), *filter(None, environment.get("PYTHONPATH", "").split(os.pathsep))]
    environment["PYTHONPATH"] = os.pathsep.join(paths)
    return environment


class Children:
    """Every process the benchmark started; each ends when the benchmark does."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self._processes: dict[int, tuple[str, asyncio.subprocess.Process]] = {}

    async def start(
        self, name: str, argv: list[str], *, stdout: bool = False
    ) -> asyncio.subprocess.Process:
        """Start ``argv`` (an absolute executable first); stderr goes to ``LOGS/name.log``."""
        with (self.logs / f"{name}.log").open("ab") as log:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-S",
                "-c",
                _WITH_PARENT,
                str(os.getpid()),
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE if stdout else log,
                stderr=log,
                cwd=REPO,
                env=_environment(),
                start_new_session=True,
                limit=_LINE_LIMIT,
            )
        self._processes[process.pid] = (name, process)
        return process

    def running(self) -> list[tuple[str, asyncio.subprocess.Process]]:
        return list(self._processes.values())

    async def stop(self, process: asyncio.subprocess.Process) -> None:
        """SIGTERM, then SIGKILL after a grace period."""
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), _STOP_GRACE)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        self._processes.pop(process.pid, None)

    async def stop_all(self) -> None:
        """Stop every child still running, the most recently started first."""
        for _, process in reversed(list(self._processes.values())):
            await self.stop(process)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def wait_port(
    port: int, process: asyncio.subprocess.Process, what: str, within: float = 30.0
) -> None:
    """Wait until something accepts connections on 127.0.0.1:``port``."""
    deadline = time.monotonic() + within
    while True:
        if process.returncode is not None:
            raise BenchError(f"{what} exited with status {process.returncode}; see its log")
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError as exc:
            if time.monotonic() > deadline:
                raise BenchError(
                    f"{what} did not listen on port {port} within {within:.0f} s"
                ) from exc
            await asyncio.sleep(0.05)
            continue
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of ``pid`` so far, threads included (0 if it is gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = text[text.rindex(")") + 2 :].split()  # fields 3.. of proc(5)
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK
