"""A bound on the connections callers hold, and which idle one goes first.

A caller's connection costs the server a file descriptor and memory (its TLS
buffers, its parser) before the caller has shown any credential: so their
number is bounded (``--max-caller-connections``). Agents, which present a
client certificate this server issued and has not revoked, are not callers
and are not counted: no number of callers can keep a bootstrapped agent out.

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
from collections import OrderedDict
from typing import Protocol

from cryptography import x509

__all__ = [
    "DEFAULT_MAX_CALLER_CONNECTIONS",
    "CallerConnections",
    "CountedProtocol",
    "Evictable",
    "peer_certificate_serial",
]

#: Caller connections open at once by default: far more than people and their
#: tools hold (kubectl holds one or a few, and one per watch, log stream,
#: exec and port-forward), and with 64 KiB of TLS buffer each, 256 MiB at most.
DEFAULT_MAX_CALLER_CONNECTIONS = 4096


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


class CountedProtocol(asyncio.Protocol):
    """Wraps the protocol a caller's connection was handed to, to release its count."""

    def __init__(self, inner: asyncio.Protocol, callers: CallerConnections) -> None:
        #: The protocol the connection was handed to.
        self.inner = inner
        self._callers = callers

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._callers.release()
        self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


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
