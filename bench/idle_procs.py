"""What the idle-agents benchmark adds to :mod:`bench.procs`: its module, /proc figures in the
shape it reports, and the open-files limit its thousands of sockets need.

Child processes (started with ``PR_SET_PDEATHSIG``, ended by pid) come from
:mod:`bench.procs`, shared with the other benchmarks. The figures come from
``/proc/PID/stat`` (CPU) and ``/proc/PID/status`` (memory).
"""

from __future__ import annotations

import contextlib
import os
import resource
from pathlib import Path

from .procs import PIPE_LIMIT, REPO, BenchError, Children, free_port

__all__ = [
    "MODULE",
    "PIPE_LIMIT",
    "REPO",
    "STOP_GRACE",
    "BenchError",
    "Children",
    "cpu_seconds",
    "free_port",
    "memory_kib",
    "raise_nofile",
]

#: The benchmark's module; its hidden ``--role`` runs each kind of child.
MODULE = "bench.bench_idle_agents"
#: A server holding thousands of agents may take this long to drain at SIGTERM.
STOP_GRACE = 10.0
_CLK_TCK = os.sysconf("SC_CLK_TCK")


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
