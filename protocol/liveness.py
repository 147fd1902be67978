"""Liveness of a connection: PINGs and their round trips, and the keepalive clock.

A :class:`Liveness` belongs to one :class:`~protocol.connection.Connection`.
It remembers the PINGs in flight, and when the peer was last heard from, and
says when the connection must next be ticked and whether the peer missed its
deadline (docs/protocol.md, "Liveness"): no HELLO within the keepalive
timeout, no PONG to the keepalive PING within it, or none to the probe (a PING
sent with new work for a quiet peer) within its own. Time enters as ``now``
arguments; nothing here reads a clock. The connection queues the frames and
fails itself; this only keeps the books.
"""

from __future__ import annotations

from .errors import KeepaliveTimeoutError
from .limits import Keepalive

__all__ = ["MAX_OUTSTANDING_PINGS", "Liveness"]

#: PINGs remembered for their round-trip time; older ones are forgotten.
MAX_OUTSTANDING_PINGS = 64


class Liveness:
    """The PINGs in flight and the keepalive clock of one connection."""

    __slots__ = (
        "_next_ping",
        "_pings",
        "_started",
        "keepalive",
        "keepalive_ping",
        "last_received",
        "probe_ping",
    )

    def __init__(self, keepalive: Keepalive) -> None:
        self.keepalive = keepalive
        #: The PING sent because the peer was quiet, while it is unanswered.
        self.keepalive_ping: int | None = None
        #: The PING sent with new work for a quiet peer, while it is unanswered.
        self.probe_ping: int | None = None
        #: When the last message from the peer arrived.
        self.last_received: float | None = None
        self._pings: dict[int, float] = {}
        self._next_ping = 1
        self._started: float | None = None

    def deadline(self, *, handshake: bool) -> float | None:
        """When the connection must next be ticked, if the clock is running."""
        if handshake:
            return None if self._started is None else self._started + self.keepalive.timeout
        if self.keepalive_ping is not None and self.keepalive_ping in self._pings:
            deadline = self._pings[self.keepalive_ping] + self.keepalive.timeout
        elif self.last_received is None:
            return None
        else:
            deadline = self.last_received + self.keepalive.interval
        if self.probe_ping is not None and self.probe_ping in self._pings:
            deadline = min(deadline, self._pings[self.probe_ping] + self.keepalive.probe_timeout)
        return deadline

    def ping(self, now: float) -> int:
        """Remember a PING sent at ``now``; return its opaque value."""
        opaque = self._next_ping
        self._next_ping += 1
        self._pings[opaque] = now
        if len(self._pings) > MAX_OUTSTANDING_PINGS:
            del self._pings[next(iter(self._pings))]
        return opaque

    def pong(self, opaque: int, now: float) -> float | None:
        """The round trip of the PING a PONG answers, or None for one not remembered."""
        sent = self._pings.pop(opaque, None)
        if sent is None:
            return None  # unsolicited or forgotten: harmless
        return max(0.0, now - sent)

    def missed(self, now: float, *, handshake: bool) -> KeepaliveTimeoutError | None:
        """Start the clock; the error to fail with if the peer missed its deadline."""
        if self._started is None:
            self._started = now
        timeout = self.keepalive.timeout
        if handshake:
            if now - self._started >= timeout:
                return KeepaliveTimeoutError(f"the peer sent no HELLO within {timeout:g}s")
            return None
        if self.last_received is None:
            self.last_received = now
        if self.keepalive_ping is not None:
            sent = self._pings.get(self.keepalive_ping)
            if sent is None:
                self.keepalive_ping = None
            elif now - sent >= timeout:
                return KeepaliveTimeoutError(f"the peer did not answer a PING within {timeout:g}s")
        if self.probe_ping is not None:
            sent = self._pings.get(self.probe_ping)
            probe_timeout = self.keepalive.probe_timeout
            if sent is None:
                self.probe_ping = None
            elif now - sent >= probe_timeout:
                return KeepaliveTimeoutError(
                    f"the peer did not answer a PING within {probe_timeout:g}s "
                    f"(sent with new work after {self.keepalive.probe_after:g}s or more "
                    "without a message from it)"
                )
        return None

    def probe_due(self, now: float) -> bool:
        """True when new work should carry a PING: the peer was quiet, and none is out for it."""
        if self.probe_ping is not None:
            if self.probe_ping in self._pings:
                return False
            self.probe_ping = None  # answered
        return (
            self.last_received is not None
            and now - self.last_received >= self.keepalive.probe_after
        )

    def keepalive_due(self, now: float) -> bool:
        """True when the peer has been quiet for the interval and no keepalive PING is out."""
        return (
            self.keepalive_ping is None
            and self.last_received is not None
            and now - self.last_received >= self.keepalive.interval
        )
