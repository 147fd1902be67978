"""Child processes of the idle-agents benchmark, and what /proc says about them.

Every child (the servers, the agent workers) is started through a tiny
wrapper that sets ``PR_SET_PDEATHSIG`` (it dies with the benchmark, even one
killed by SIGKILL) and then ``execv``'s the real program in its own session,
so that a Ctrl-C reaches the benchmark alone; the benchmark ends each child by
its pid (SIGTERM, then SIGKILL after a grace period). The figures come from
``/proc/PID/stat`` (CPU) and ``/proc/PID/status`` (memory).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import socket
import sys
from pathlib import Path

__all__ = [
    "MODULE",
    "PIPE_LIMIT",
    "REPO",
    "BenchError",
    "Children",
    "cpu_seconds",
    "free_port",
    "memory_kib",
    "raise_nofile",
]

REPO = Path(__file__).resolve().parents[1]
#: The benchmark's module; its hidden ``--role`` runs each kind of child.
MODULE = "bench.bench_idle_agents"
#: The longest JSON line a worker and the orchestrator exchange.
PIPE_LIMIT = 16 * 1024 * 1024
_CLK_TCK = os.sysconf("SC_CLK_TCK")
_STOP_GRACE = 10.0

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


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of ``pid`` so far."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()  # fields 3.. of proc(5)
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM (peak RSS) and RssAnon of ``pid``, in KiB."""
    values: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon"):
            values[key] = int(rest.split()[0])
    return values


def raise_nofile() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE as far as the hard limit allows; return both."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _child_environment() -> dict[str, str]:
    # The tree this benchmark is in, also for console scripts (their sys.path lacks the cwd).
    environment = dict(os.environ)
    paths = [str(REPO), *filter(None, environment.get("PYTHONPATH", "").split(os.pathsep))]
    environment["PYTHONPATH"] = os.pathsep.join(paths)
    return environment


class Children:
    """Every process the benchmark started; each ends when the benchmark does."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self._processes: list[asyncio.subprocess.Process] = []

    async def start(
        self, name: str, argv: list[str], *, pipes: bool = False
    ) -> asyncio.subprocess.Process:
        with (self.logs / f"{name}.log").open("ab") as log:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-S",
                "-c",
                _WITH_PARENT,
                str(os.getpid()),
                *argv,
                stdin=asyncio.subprocess.PIPE if pipes else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE if pipes else log,
                stderr=log,
                cwd=REPO,
                env=_child_environment(),
                start_new_session=True,  # a Ctrl-C reaches the benchmark alone; it ends them
                limit=PIPE_LIMIT,
            )
        self._processes.append(process)
        return process

    async def stop(self, process: asyncio.subprocess.Process) -> None:
        """SIGTERM, then SIGKILL after a grace period."""
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
            try:
                await asyncio.wait_for(process.wait(), _STOP_GRACE)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        if process in self._processes:
            self._processes.remove(process)

    async def stop_all(self) -> None:
        await asyncio.gather(*(self.stop(process) for process in list(self._processes)))
