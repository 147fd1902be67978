"""What a path of the proxy benchmark costs: CPU and memory by process group.

A group is a name and the processes behind it (``server``, ``agent``,
``upstream``, ``sshd``...). Snapshots are taken before and after a
measurement; the differences give CPU per request, per GB, or cores busy.
"""

from __future__ import annotations

import os
from pathlib import Path

from .procs import cpu_seconds, memory_kib

__all__ = ["cores_busy", "cpu_per", "cpu_snapshot", "rss_kib"]

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_snapshot(groups: dict[str, list[int]]) -> dict[str, float]:
    """CPU seconds so far by group (``NAME``), its system part (``NAME.sys``), and ``machine``."""
    snapshot: dict[str, float] = {}
    for name, pids in groups.items():
        times = [cpu_seconds(pid) for pid in pids]
        snapshot[name] = sum(user + system for user, system in times)
        snapshot[f"{name}.sys"] = sum(system for _, system in times)
    snapshot["machine"] = _machine_busy_seconds()
    return snapshot


def rss_kib(groups: dict[str, list[int]]) -> dict[str, int]:
    """Resident memory by group, in KiB."""
    return {name: sum(memory_kib(pid) for pid in pids) for name, pids in groups.items()}


def cpu_per(
    before: dict[str, float], after: dict[str, float], units: int, scale: float
) -> dict[str, float]:
    """CPU spent per unit of work, by group (``scale``: e.g. 1e6 for microseconds)."""
    return {name: (after[name] - before[name]) * scale / max(units, 1) for name in before}


def cores_busy(
    before: dict[str, float], after: dict[str, float], seconds: float
) -> dict[str, float]:
    """Average cores busy over the window, by group."""
    return {name: (after[name] - before[name]) / max(seconds, 1e-9) for name in before}


def _machine_busy_seconds() -> float:
    """CPU seconds the whole machine has been busy (all cores, all processes)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / _CLK_TCK
