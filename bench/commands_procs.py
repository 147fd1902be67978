"""Child processes of the command benchmark: the shared helpers of ``bench.procs``.

The command benchmark reads a process's CPU as one number (user plus system).
"""

from __future__ import annotations

from .procs import REPO, BenchError, Children, free_port, wait_port
from .procs import cpu_seconds as _user_and_system

__all__ = ["REPO", "BenchError", "Children", "cpu_seconds", "free_port", "wait_port"]


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of ``pid`` so far, threads included (0 if it is gone)."""
    user, system = _user_and_system(pid)
    return user + system
