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
    """Counts the open caller connections and keeps the idle ones in order."""

    def __init__(self, limit: int = DEFAULT_MAX_CALLER_CONNECTIONS) -> None:
        if limit < 1:
            raise ValueError(f"the caller connection limit must be at least 1, not {limit}")
        self.limit = limit
        #: Caller connections open now (those closed to make room excepted).
        self.open = 0
        #: Idle ones, the longest idle first.
        self._idle: OrderedDict[Evictable, None] = OrderedDict()
        #: For metrics: connections closed to make room, and refused.
        self.evicted = 0
        self.refused = 0

    def admit(self) -> bool:
        """Count a new caller connection; False if it must be refused.

        Over the limit, the longest idle connection is closed, and no longer
        counted, so the new one takes its place: admitted if that leaves it
        within the limit (a refused one closed makes room only if another
        connection closed meanwhile).
        """
        self.open += 1
        if self.open <= self.limit:
            return True
        if self._idle:
            oldest, _ = self._idle.popitem(last=False)
            self.open -= 1
            self.evicted += 1
            oldest.evict()
            if self.open <= self.limit:
                return True
        self.refused += 1
        return False

    def release(self) -> None:
        """A counted connection closed (one closed to make room was released already)."""
        self.open -= 1

    def idle(self, connection: Evictable) -> None:
        """``connection`` has nothing in progress: it may be closed to make room."""
        self._idle[connection] = None
        self._idle.move_to_end(connection)

    def busy(self, connection: Evictable) -> None:
        """``connection`` serves a request, closed or was handed over: keep it."""
        self._idle.pop(connection, None)

    @property
    def idle_count(self) -> int:
        return len(self._idle)


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

    def __init__(self, max_callers: int = DEFAULT_MAX_CALLER_CONNECTIONS) -> None:
        self.open: set[Door] = set()
        self.callers = CallerConnections(max_callers)
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
