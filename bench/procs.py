"""Child processes of the benchmarks, and what /proc says about them.

Every child is started through a tiny wrapper that sets ``PR_SET_PDEATHSIG``
(the child gets SIGKILL if the benchmark dies, even by SIGKILL) and then
``execv``'s the real program, in its own session so that a Ctrl-C reaches the
benchmark alone; the benchmark then ends each child by its pid (SIGTERM, then
SIGKILL after a grace period), on success, failure, Ctrl-C and timeout alike.
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
    "PIPE_LIMIT",
    "REPO",
    "BenchError",
    "Children",
    "child_environment",
    "cpu_seconds",
    "descendants",
    "file_written",
    "free_port",
    "memory_kib",
    "wait_port",
]

REPO = Path(__file__).resolve().parents[1]
_CLK_TCK = os.sysconf("SC_CLK_TCK")
_STOP_GRACE = 5.0
#: The longest line a child and the benchmark exchange on a pipe.
PIPE_LIMIT = 16 * 1024 * 1024

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


def child_environment() -> dict[str, str]:
    """The environment of children: this tree first on the path (console scripts too)."""
    environment = dict(os.environ)
    paths = [str(REPO), *filter(None, environment.get("PYTHONPATH", "").split(os.pathsep))]
    environment["PYTHONPATH"] = os.pathsep.join(paths)
    return environment


class Children:
    """Every process the benchmark started; each ends when the benchmark does."""

    def __init__(self, logs: Path, *, stop_grace: float = _STOP_GRACE) -> None:
        self.logs = logs
        self.stop_grace = stop_grace
        self._processes: dict[int, tuple[str, asyncio.subprocess.Process]] = {}

    async def start(
        self,
        name: str,
        argv: list[str],
        *,
        stdin: bool = False,
        stdout: bool = False,
        env: dict[str, str] | None = None,
    ) -> asyncio.subprocess.Process:
        """Start ``argv`` (an absolute executable first); its stderr goes to ``LOGS/name.log``."""
        with (self.logs / f"{name}.log").open("ab") as log:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-S",
                "-c",
                _WITH_PARENT,
                str(os.getpid()),
                *argv,
                stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE if stdout else log,
                stderr=log,
                cwd=REPO,
                env=env if env is not None else child_environment(),
                start_new_session=True,
                limit=PIPE_LIMIT,
            )
        self._processes[process.pid] = (name, process)
        return process

    async def run(
        self, name: str, argv: list[str], *, within: float, env: dict[str, str] | None = None
    ) -> str:
        """Run ``argv`` to completion and return its stdout; raise BenchError if it fails."""
        process = await self.start(name, argv, stdout=True, env=env)
        assert process.stdout is not None
        try:
            output = await asyncio.wait_for(process.stdout.read(), within)
            await asyncio.wait_for(process.wait(), 5.0)
        except TimeoutError as exc:
            raise BenchError(f"{name} did not finish within {within:.0f} s") from exc
        finally:
            await self.stop(process)
        if process.returncode != 0:
            raise BenchError(
                f"{name} exited with status {process.returncode}; see {self.logs}/{name}.log"
            )
        return output.decode(errors="replace")

    async def stop(self, process: asyncio.subprocess.Process) -> None:
        """SIGTERM, then SIGKILL after a grace period."""
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), self.stop_grace)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        self._processes.pop(process.pid, None)

    async def stop_all(self) -> None:
        """Stop every child still running, the most recently started first."""
        for _, process in reversed(list(self._processes.values())):
            await self.stop(process)

    def name_of(self, pid: int) -> str:
        return self._processes[pid][0] if pid in self._processes else str(pid)


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


def cpu_seconds(pid: int) -> tuple[float, float]:
    """User and system CPU time of ``pid`` so far (zeros if it is gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0, 0.0
    fields = text[text.rindex(")") + 2 :].split()  # fields 3.. of proc(5)
    return int(fields[11]) / _CLK_TCK, int(fields[12]) / _CLK_TCK


def memory_kib(pid: int) -> int:
    """VmRSS of ``pid`` in KiB (0 if it is gone)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def descendants(pid: int) -> list[int]:
    """``pid``'s children, their children and so on (sshd forks one per connection)."""
    found: list[int] = []
    queue = [pid]
    while queue:
        parent = queue.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            with contextlib.suppress(OSError, ValueError):
                children = [int(x) for x in (task / "children").read_text().split()]
                found.extend(children)
                queue.extend(children)
    return found


async def file_written(path: Path, what: str, within: float = 30.0) -> Path:
    """``path`` once a child has written it (by a rename, after a signal)."""
    deadline = time.monotonic() + within
    while not await asyncio.to_thread(path.exists):
        if time.monotonic() > deadline:
            raise BenchError(f"no {what} at {path} {within:g} s after asking for it")
        await asyncio.sleep(0.05)
    return path
