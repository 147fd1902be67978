"""What a connection is: which side it is, what state it is in, and its counters.

These are the value types of :class:`~protocol.connection.Connection`'s public
interface (docs/protocol.md, "The sans-I/O interface"). They live apart from
the class so that the modules the connection is split into (``handlers``,
``outbox``) can use them without importing the connection itself; users import
them from ``protocol`` or ``protocol.connection`` as before.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["ConnectionState", "ConnectionStats", "Side"]


class Side(enum.Enum):
    """Which end of the WebSocket: the side that dialled is the client."""

    CLIENT = "client"
    SERVER = "server"


class ConnectionState(enum.Enum):
    """Where a connection is: waiting for the peer's HELLO, open, or ended."""

    HANDSHAKE = "handshake"
    OPEN = "open"
    CLOSED = "closed"


@dataclass(slots=True)
class ConnectionStats:
    """Counters for metrics and for proving that no stream leaks.

    Every stream counted in ``streams_opened`` is, at any moment, either still
    open or counted once in ``streams_closed``, ``streams_reset`` or
    ``streams_aborted`` (ended because the connection ended).
    """

    streams_opened: int = 0
    streams_closed: int = 0
    streams_reset: int = 0
    streams_aborted: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    messages_sent: int = 0
    messages_received: int = 0
