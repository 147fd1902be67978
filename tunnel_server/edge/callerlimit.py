"""A bound on the connections callers hold, and which idle one goes first.

A caller's connection costs the server a file descriptor and memory (its TLS
buffers, its parser) before the caller has shown any credential: so their
number is bounded (``--max-caller-connections``). Agents, which present a
client certificate this server issued and has not revoked, are not callers
and are not counted: no number of callers can keep a bootstrapped agent out. Each agent certificate
holds at most a few connections uncounted (:class:`AgentConnections`).

Past the bound, the caller connection idle the longest (between two requests,
or before its first) is closed to make room, as the idle timeout would have
closed it later; a client opens a new one when it needs one. When every
caller connection is serving a request, the new one is refused: its first
request is answered 503 with ``Retry-After`` (unless room was made by the
time it comes). A refused connection waiting for its request is idle too, and
the next newcomer takes its place, refused in turn unless room was made: so at
most one connection is ever open past the limit.

One source address holds at most half of them (``--max-caller-connections-
per-address``): past it, that address's own connection idle the longest goes,
or its new one is refused. So one address, whose connections each hold a slow
request (a body sent a byte at a time, for up to its 30 s), cannot keep every
other caller out.

The front door tells this module when a connection turns idle and busy; a
connection handed to aiohttp (the REST API, upgrades) stays counted until it
closes, but is never closed from here: it serves one request and closes
(app.py).
"""

from __future__ import annotations

import asyncio
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Protocol

from cryptography import x509

__all__ = [
    "DEFAULT_MAX_CALLER_CONNECTIONS",
    "MAX_CONNECTIONS_PER_AGENT",
    "AgentConnections",
    "CallerConnections",
    "CountedProtocol",
    "Door",
    "Evictable",
    "FrontDoors",
    "peer_certificate_serial",
]

#: Caller connections open at once by default: far more than people and their
#: tools hold (kubectl holds one or a few, and one per watch, log stream,
#: exec and port-forward), and with 64 KiB of TLS buffer each, 256 MiB at most.
DEFAULT_MAX_CALLER_CONNECTIONS = 4096
#: Connections one agent certificate holds without being counted as a caller's.
MAX_CONNECTIONS_PER_AGENT = 4


class Evictable(Protocol):
    """A caller connection that can be closed to make room."""

    def evict(self) -> None: ...


class CallerConnections:
    """Counts the open caller connections, per source address too, and keeps the idle ones in order.

    ``source`` is the address a connection came from, as
    :func:`tunnel_server.edge.handshakes.source_of` counts it (IPv4, or IPv6 by
    /48); "" when unknown.
    """

    def __init__(
        self,
        limit: int = DEFAULT_MAX_CALLER_CONNECTIONS,
        per_address: int | None = None,
    ) -> None:
        if limit < 1:
            raise ValueError(f"the caller connection limit must be at least 1, not {limit}")
        if per_address is not None and per_address < 1:
            raise ValueError(f"the limit per address must be at least 1, not {per_address}")
        self.limit = limit
        #: The most one source address holds: half the limit unless told.
        self.per_address = min(per_address or max(limit // 2, 1), limit)
        #: Caller connections open now (those closed to make room excepted).
        self.open = 0
        self._held: Counter[str] = Counter()
        #: Idle ones, the longest idle first, with their source.
        self._idle: OrderedDict[Evictable, str] = OrderedDict()
        #: The same, per source (insertion-ordered), so that an address past
        #: its share finds its own at once, however many others are idle.
        self._idle_of: dict[str, dict[Evictable, None]] = {}
        #: For metrics: connections closed to make room, and refused.
        self.evicted = 0
        self.refused = 0
        self.refused_per_address = 0

    def admit(self, source: str = "") -> bool:
        """Count a new caller connection from ``source``; False if it must be refused.

        Past its address's share, that address's connections idle the longest
        are closed to make room; past the server's bound, the one idle the
        longest of all (not for one refused at its share, unless two would be
        past the server's bound). The new one is admitted if that leaves it
        within both (a refused one closed makes room only if another connection
        closed meanwhile). A refused one is counted, idle until its request,
        and at most one connection is ever open past the server's bound.
        """
        self.open += 1
        held = self._held[source] = self._held[source] + 1
        while held > self.per_address:
            own = self._idle_of.get(source)
            if not own:
                break
            self._evict(next(iter(own)))
            held -= 1
        over_share = held > self.per_address
        # One refused past its share closes no other address's connection,
        # unless that keeps more than one open past the server's bound.
        if self.open > self.limit + (1 if over_share else 0) and self._idle:
            self._evict(next(iter(self._idle)))
        if not over_share and self.open <= self.limit:
            return True
        self.refused += 1
        if over_share and self.per_address < self.limit:
            self.refused_per_address += 1
        return False

    def release(self, source: str = "") -> None:
        """A counted connection closed (one closed to make room was released already)."""
        self.open -= 1
        self._held[source] -= 1
        if self._held[source] <= 0:
            del self._held[source]

    def idle(self, connection: Evictable, source: str = "") -> None:
        """``connection`` has nothing in progress: it may be closed to make room."""
        self._idle[connection] = source
        self._idle.move_to_end(connection)
        own = self._idle_of.get(source)
        if own is None:
            own = self._idle_of[source] = {}
        own.pop(connection, None)
        own[connection] = None

    def busy(self, connection: Evictable) -> None:
        """``connection`` serves a request, closed or was handed over: keep it."""
        source = self._idle.pop(connection, None)
        if source is not None:
            own = self._idle_of[source]
            del own[connection]
            if not own:
                del self._idle_of[source]

    def held(self, source: str) -> int:
        """The caller connections ``source`` holds now."""
        return self._held[source]

    def refusal(self, source: str = "") -> str | None:
        """Why a connection refused when it came is refused still, or None if room was made."""
        if self._held[source] > self.per_address and self.per_address < self.limit:
            return (
                f"your address holds {self.per_address} connections to the tunnel server, its "
                "limit per address (--max-caller-connections-per-address), each serving a "
                "request; try again shortly"
            )
        if self.open > self.limit:  # also when a share as large as the limit is passed
            return (
                f"the tunnel server holds {self.limit} caller connections, its limit "
                "(--max-caller-connections), each serving a request; try again shortly"
            )
        return None

    @property
    def idle_count(self) -> int:
        return len(self._idle)

    def _evict(self, connection: Evictable) -> None:
        source = self._idle[connection]
        self.busy(connection)
        self.release(source)
        self.evicted += 1
        connection.evict()


class AgentConnections:
    """Counts the connections each agent certificate holds, to bound them.

    An agent holds one (its session), and for a moment two while a reconnect
    overlaps the end of the old one. Past :data:`MAX_CONNECTIONS_PER_AGENT`,
    a connection with that certificate is counted as a caller's: otherwise one
    agent, or a thief with its key, could open connections without bound and
    use up the server's file descriptors.
    """

    def __init__(self, per_agent: int = MAX_CONNECTIONS_PER_AGENT) -> None:
        self.per_agent = per_agent
        self._open: Counter[int] = Counter()

    def admit(self, serial: int) -> bool:
        """Count a connection of the agent with this serial; False past its bound."""
        if self._open[serial] >= self.per_agent:
            return False
        self._open[serial] += 1
        return True

    def release(self, serial: int) -> None:
        self._open[serial] -= 1
        if self._open[serial] <= 0:
            del self._open[serial]

    def held(self, serial: int) -> int:
        """The connections the agent with this serial holds now."""
        return self._open[serial]


class CountedProtocol(asyncio.Protocol):
    """Wraps the protocol a counted connection was handed to, to release its count."""

    def __init__(self, inner: asyncio.Protocol, release: Callable[[], None]) -> None:
        #: The protocol the connection was handed to.
        self.inner = inner
        self._release = release

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._release()
        self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class Door(Protocol):
    """A front-door connection, as the server's shutdown sees it."""

    @property
    def busy(self) -> bool: ...

    def close(self) -> asyncio.Task[None] | None: ...

    def abort(self) -> asyncio.Task[None] | None: ...


class FrontDoors:
    """The open front-door connections, closed together at shutdown, and the
    count of callers' connections, bounded by ``max_callers``."""

    def __init__(
        self, max_callers: int = DEFAULT_MAX_CALLER_CONNECTIONS, per_address: int | None = None
    ) -> None:
        self.open: set[Door] = set()
        self.callers = CallerConnections(max_callers, per_address)
        self.agents = AgentConnections()

    async def close(self) -> None:
        """Close every connection and wait for their requests to end.

        Called after the agents' sessions were drained: a request still running
        waits on a caller that does not read, so its connection is aborted; an
        idle one is closed, its last answer still sent.
        """
        tasks = [door.abort() if door.busy else door.close() for door in list(self.open)]
        pending = [task for task in tasks if task is not None]
        await asyncio.gather(*pending, return_exceptions=True)


def peer_certificate_serial(transport: asyncio.BaseTransport) -> int | None:
    """The serial of the client certificate the peer presented, or None.

    The TLS handshake verified it already (an invalid one fails the handshake),
    so it is one this server's CA issued: an agent's, unless revoked. A
    revoked one is a caller's: only the agent socket would refuse it, and its
    holder could otherwise keep any number of connections idle, uncounted.
    """
    ssl_object = transport.get_extra_info("ssl_object")
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    if der is None:
        return None
    serial: int = x509.load_der_x509_certificate(der).serial_number
    return serial
