"""Multiplexed sessions on asyncio: the protocol driven over a WebSocket.

A :class:`Session` owns one sans-I/O ``protocol.Connection`` and one message
transport (a WebSocket of websockets or aiohttp, adapted by the agent or the
server). It gives each stream an async reader/writer with backpressure. It
depends on ``protocol`` and asyncio; the agent and the server both build on it.
"""

from .errors import (
    PeerProtocolError,
    SessionClosedError,
    SessionError,
    SessionTimeoutError,
    StreamResetError,
)
from .session import Session, SessionHandlers
from .stream import MuxStream
from .transport import MessageTransport, TransportClosed
from .websocket import WebSocketTransport

__all__ = [
    "MessageTransport",
    "MuxStream",
    "PeerProtocolError",
    "Session",
    "SessionClosedError",
    "SessionError",
    "SessionHandlers",
    "SessionTimeoutError",
    "StreamResetError",
    "TransportClosed",
    "WebSocketTransport",
]
