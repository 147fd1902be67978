"""Helpers shared by the test tiers."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable


async def until(condition: Callable[[], bool], *, max_turns: int = 200_000) -> None:
    """Yield to the event loop until ``condition()`` holds.

    This waits on a state change other tasks make, turn by turn; it never
    sleeps for a length of time. It fails, naming the condition, if the
    state never comes.
    """
    for _ in range(max_turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"condition never became true: {condition}")


class ManualClock:
    """A monotonic clock that moves only when a test sets ``now``."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def assert_tcp_keepalive(sock: socket.socket) -> None:
    """``sock`` probes a silent peer with Go's timing (tunnel_kube/tcp_keepalive.py)."""
    assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    assert (
        sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
        sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
        sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
    ) == (15, 15, 4)
