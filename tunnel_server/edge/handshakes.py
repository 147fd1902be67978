"""Which accepted connections start their TLS handshake, and which are let go.

A TLS handshake costs the server a key exchange and a signature (and a
certificate check for an agent's), so only so many run at once: when thousands
of agents reconnect after a restart, advancing every handshake together would
finish none for seconds (docs/benchmarks.md, "Idle agents"). Those few slots
are what a flood aims at. When a slot was taken at accept, 64 connections
that never spoke TLS kept every caller and every agent out of the server for
the 10 s of their deadline, for as long as they were renewed.

So a slot is held only while the handshake has work in it, and no source
address can crowd the others out (docs/security.md, "Parsing what callers
and agents send"):

- a connection waits for its whole ClientHello before it is queued for a slot
  (the listener has the kernel wake it only then, with ``SO_RCVLOWAT``, and
  closes at once what is no ClientHello): a silent or trickling client holds
  a file descriptor and no slot, until the handshake deadline closes it;
- at most ``held`` connections wait so or are queued; past that, or when the
  process runs out of file descriptors, the oldest of the source address
  holding the most is closed (one still waiting for its ClientHello before
  one queued);
- queued connections take free slots in turn by source address, so one
  address's thousand connections do not keep another's one behind them;
- when every slot is taken, the oldest handshake of the addresses holding the
  most slots is abandoned, once in progress for more than ``grace``, for a
  queued connection whose address holds fewer. The server's part of a
  handshake takes milliseconds, so a handshake that long is waiting on its
  client.

A source address is an IPv4 address or an IPv6 /48: a /64 is a single
network and sites get /56 or /48 prefixes (RFC 6177), free from tunnel
brokers, so counting /64s would give one site hundreds of turns. Behind a load
balancer that hides callers' addresses, every caller shares the balancer's
and only the first two points hold: the balancer's own limits per address are
the defence there.

This module is the policy alone; :mod:`tunnel_server.edge.listener` does the I/O.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = [
    "DEFAULT_GRACE",
    "DEFAULT_HANDSHAKES",
    "DEFAULT_HELD",
    "DEFAULT_TIMEOUT",
    "HandshakeAdmission",
    "Schedule",
    "source_of",
]

#: Handshakes in progress at once.
DEFAULT_HANDSHAKES = 64
#: Connections accepted whose handshake has not started: as many as the listen
#: queue held when the kernel kept them (and a file descriptor each).
DEFAULT_HELD = 4096
#: Seconds after which a handshake in progress may be abandoned for another
#: address's connection: many round trips on the slowest links, and far more
#: than the server's own part takes, even while a reconnect storm runs.
DEFAULT_GRACE = 2.0
#: Seconds from a connection's accept by which its handshake must be done.
DEFAULT_TIMEOUT = 10.0

C = TypeVar("C", bound=Hashable)


#: The IPv6 prefix one source is counted under (see above).
IPV6_SOURCE_PREFIX = 48


def source_of(host: str) -> str:
    """The source address ``host`` is counted under: IPv4 as is, IPv6 by /48."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, IPV6_SOURCE_PREFIX), strict=False))
    return str(address)


@dataclass(frozen=True, slots=True)
class Schedule(Generic[C]):
    """What the listener does now: start handshakes, abandon others, and when to ask again."""

    start: list[C] = field(default_factory=list)
    abandon: list[C] = field(default_factory=list)
    #: When a handshake in progress passes its grace and may be abandoned.
    recheck_at: float | None = None


class _Tally:
    """Counts per source, with the source holding the most at hand."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._by_count: dict[int, dict[str, None]] = {}
        self._top = 0

    def __getitem__(self, source: str) -> int:
        return self._counts.get(source, 0)

    def add(self, source: str) -> None:
        self._move(source, +1)

    def remove(self, source: str) -> None:
        self._move(source, -1)

    def heaviest(self) -> str | None:
        """A source holding the most (the first to reach that count), or None."""
        bucket = self._by_count.get(self._top)
        return next(iter(bucket)) if bucket else None

    def all_heaviest(self) -> list[str]:
        """Every source holding the most."""
        return list(self._by_count.get(self._top, ()))

    def _move(self, source: str, step: int) -> None:
        old = self._counts.get(source, 0)
        new = old + step
        if old:
            bucket = self._by_count[old]
            del bucket[source]
            if not bucket:
                del self._by_count[old]
        if new:
            self._counts[source] = new
            self._by_count.setdefault(new, {})[source] = None
        else:
            del self._counts[source]
        if new > self._top or (old == self._top and old not in self._by_count):
            self._top = new


class _Source(Generic[C]):
    """One source address's connections, each kind oldest first."""

    __slots__ = ("queued", "shaking", "waiting")

    def __init__(self) -> None:
        self.waiting: dict[C, None] = {}
        self.queued: dict[C, None] = {}
        #: Handshakes in progress, with the time each started.
        self.shaking: dict[C, float] = {}

    def __bool__(self) -> bool:
        return bool(self.waiting or self.queued or self.shaking)


class HandshakeAdmission(Generic[C]):
    """Admits accepted connections to at most ``handshakes`` TLS handshakes at once."""

    def __init__(
        self,
        handshakes: int = DEFAULT_HANDSHAKES,
        held: int = DEFAULT_HELD,
        grace: float = DEFAULT_GRACE,
    ) -> None:
        if handshakes < 1 or held < 1:
            raise ValueError("the handshake and held-connection bounds must be at least 1")
        if grace <= 0:
            raise ValueError("the handshake grace must be positive")
        self.handshakes = handshakes
        self.held_limit = held
        self.grace = grace
        self._sources: dict[str, _Source[C]] = {}
        self._source_of: dict[C, str] = {}
        #: Connections waiting or queued, per source: who is closed past ``held``.
        self._held = _Tally()
        #: Handshakes in progress, per source: whose is abandoned.
        self._shaking = _Tally()
        #: Sources with queued connections, in the order they take free slots.
        self._turns: dict[str, None] = {}
        #: For metrics.
        self.waiting = 0
        self.queued = 0
        self.in_progress = 0
        self.closed_for_room = 0
        self.timed_out = 0
        self.not_tls = 0
        self.abandoned = 0

    def accepted(self, connection: C, host: str) -> C | None:
        """Count a new connection from ``host``, waiting for its ClientHello.

        Returns a connection to close to make room (``connection`` itself,
        maybe), or None.
        """
        source = source_of(host)
        self._source_of[connection] = source
        self._sources.setdefault(source, _Source()).waiting[connection] = None
        self._held.add(source)
        self.waiting += 1
        if self.waiting + self.queued <= self.held_limit:
            return None
        return self.make_room()

    def make_room(self) -> C | None:
        """Let go of the oldest connection of the source holding the most, if any."""
        heaviest = self._held.heaviest()
        if heaviest is None:
            return None
        entry = self._sources[heaviest]
        victim = next(iter(entry.waiting or entry.queued))
        self._forget(victim)
        self.closed_for_room += 1
        return victim

    def ready(self, connection: C) -> None:
        """``connection``'s ClientHello is whole: queue it for a slot."""
        source = self._source_of.get(connection)
        if source is None:
            return
        entry = self._sources[source]
        if connection in entry.waiting:
            del entry.waiting[connection]
            self.waiting -= 1
            entry.queued[connection] = None
            self.queued += 1
            self._turns.setdefault(source, None)

    def gone(self, connection: C, *, timed_out: bool = False, not_tls: bool = False) -> None:
        """``connection`` closed before its handshake started.

        By its client, the listener's stop, its deadline (``timed_out``), or
        because what it sent is no ClientHello (``not_tls``).
        """
        source = self._source_of.get(connection)
        if source is not None and connection not in self._sources[source].shaking:
            self._forget(connection)
            self.timed_out += timed_out
            self.not_tls += not_tls

    def finished(self, connection: C) -> None:
        """``connection``'s handshake ended, done or failed (a no-op once abandoned)."""
        source = self._source_of.pop(connection, None)
        if source is None:
            return
        entry = self._sources[source]
        del entry.shaking[connection]
        self._shaking.remove(source)
        self.in_progress -= 1
        if not entry:
            del self._sources[source]

    def schedule(self, now: float) -> Schedule[C]:
        """Hand free slots to queued connections, abandoning stalled handshakes for them."""
        start: list[C] = []
        abandon: list[C] = []
        recheck_at: float | None = None
        while self._turns:
            if self.in_progress < self.handshakes:
                start.append(self._start(next(iter(self._turns)), now))
                continue
            heaviest = self._shaking.all_heaviest()
            most = self._shaking[heaviest[0]]
            # The first in turn holding fewer: at most a slot's worth of sources hold as many.
            contender = next(
                (source for source in self._turns if self._shaking[source] < most), None
            )
            if contender is None:
                break
            # The oldest of the heaviest (a slot's worth of sources at most).
            victim, started = min(
                (next(iter(self._sources[source].shaking.items())) for source in heaviest),
                key=lambda handshake: handshake[1],
            )
            if now - started < self.grace:
                recheck_at = started + self.grace
                break
            self.finished(victim)
            self.abandoned += 1
            abandon.append(victim)
            start.append(self._start(contender, now))
        return Schedule(start, abandon, recheck_at)

    def _start(self, source: str, now: float) -> C:
        entry = self._sources[source]
        connection = next(iter(entry.queued))
        del entry.queued[connection]
        self.queued -= 1
        self._held.remove(source)
        del self._turns[source]
        if entry.queued:
            self._turns[source] = None
        entry.shaking[connection] = now
        self._shaking.add(source)
        self.in_progress += 1
        return connection

    def _forget(self, connection: C) -> None:
        """Drop a waiting or queued connection."""
        source = self._source_of.pop(connection)
        entry = self._sources[source]
        if connection in entry.waiting:
            del entry.waiting[connection]
            self.waiting -= 1
        else:
            del entry.queued[connection]
            self.queued -= 1
            if not entry.queued:
                self._turns.pop(source, None)
        self._held.remove(source)
        if not entry:
            del self._sources[source]
