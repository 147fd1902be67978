"""Two in-memory endpoints back to back, and helpers to speak frames by hand.

A :class:`Pair` joins a ``Connection(Side.CLIENT)`` and a
``Connection(Side.SERVER)`` by shuttling ``data_to_send()`` into
``receive_data(now)``: the protocol tier needs nothing but bytes. To play a
misbehaving peer, a test encodes frames itself with :func:`feed` and reads
what the connection answers with :func:`sent_frames`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

from protocol import Connection, ConnectionStats, Keepalive, Limits, Side
from protocol.events import Event
from protocol.frames import DataFrame, Frame, HelloFrame, decode_message, encode_message
from protocol.limits import MAX_FRAME_SIZE

__all__ = [
    "READ_ALL",
    "Pair",
    "assert_accounted",
    "data_frames",
    "decode_all",
    "feed",
    "handshaken",
    "hello",
    "of_type",
    "sent_frames",
]

#: Limits that let a test decode anything a connection may legally send.
READ_ALL = Limits(max_frame_size=MAX_FRAME_SIZE, max_header_size=MAX_FRAME_SIZE)

_E = TypeVar("_E")


class Pair:
    """A client and a server connection joined by an in-memory wire.

    Messages travel only when a test says so (:meth:`send`, :meth:`exchange`),
    with the pair's ``now`` as the receive time.
    """

    def __init__(
        self,
        client: Connection | None = None,
        server: Connection | None = None,
        *,
        handshake: bool = True,
        now: float = 0.0,
    ) -> None:
        self.client = client if client is not None else Connection(Side.CLIENT)
        self.server = server if server is not None else Connection(Side.SERVER)
        self.now = now
        if handshake:
            self.exchange()
            assert self.client.version is not None
            assert self.server.version is not None

    def peer(self, connection: Connection) -> Connection:
        """The other end of ``connection``."""
        return self.server if connection is self.client else self.client

    def send(self, source: Connection, max_messages: int | None = None) -> list[Event]:
        """Deliver what ``source`` has to send to its peer; return the peer's events."""
        target = self.peer(source)
        events: list[Event] = []
        for message in source.data_to_send(max_messages):
            events.extend(target.receive_data(message, self.now))
        return events

    def exchange(self, *, max_rounds: int = 1000) -> tuple[list[Event], list[Event]]:
        """Shuttle both ways until neither side has more to send.

        Returns the events the client and the server received, in order.
        """
        client_events: list[Event] = []
        server_events: list[Event] = []
        for _ in range(max_rounds):
            to_server = self.client.data_to_send()
            for message in to_server:
                server_events.extend(self.server.receive_data(message, self.now))
            to_client = self.server.data_to_send()
            for message in to_client:
                client_events.extend(self.client.receive_data(message, self.now))
            if not to_server and not to_client:
                return client_events, server_events
        raise AssertionError(f"the pair still talked after {max_rounds} rounds")


def hello(
    limits: Limits | None = None,
    *,
    versions: tuple[int, int] = (1, 1),
    capabilities: Iterable[str] = (),
) -> HelloFrame:
    """A HELLO as a hand-played peer would send it."""
    return HelloFrame(versions[0], versions[1], limits or Limits(), frozenset(capabilities))


def feed(connection: Connection, *frames: Frame, now: float = 0.0) -> list[Event]:
    """Encode ``frames`` as one message and feed it to ``connection``."""
    return connection.receive_data(encode_message(frames), now)


def decode_all(messages: Iterable[bytes]) -> list[Frame]:
    """The frames of ``messages``, in order."""
    return [frame for message in messages for frame in decode_message(message, READ_ALL)]


def sent_frames(connection: Connection, max_messages: int | None = None) -> list[Frame]:
    """Decode every frame ``connection`` has to send now, in order."""
    return decode_all(connection.data_to_send(max_messages))


def handshaken(
    side: Side = Side.SERVER,
    limits: Limits | None = None,
    *,
    peer_limits: Limits | None = None,
    keepalive: Keepalive | None = None,
    now: float = 0.0,
) -> Connection:
    """A connection whose handshake a hand-played peer has completed.

    Its own HELLO has been taken from the send queue, so what it sends next is
    only what the test provokes.
    """
    connection = Connection(side, limits, keepalive=keepalive)
    frames = sent_frames(connection)
    assert [type(frame) for frame in frames] == [HelloFrame]
    feed(connection, hello(peer_limits), now=now)
    assert connection.version is not None
    return connection


def of_type(items: Iterable[object], kind: type[_E]) -> list[_E]:
    """The items that are instances of ``kind``, in order."""
    return [item for item in items if isinstance(item, kind)]


def data_frames(frames: Sequence[Frame], stream_id: int | None = None) -> list[DataFrame]:
    """DATA frames, optionally of one stream only."""
    return [
        frame
        for frame in of_type(frames, DataFrame)
        if stream_id is None or frame.stream_id == stream_id
    ]


def assert_accounted(*connections: Connection) -> None:
    """Every stream ever opened is open or counted in exactly one terminal state."""
    for connection in connections:
        stats: ConnectionStats = connection.stats
        ended = stats.streams_closed + stats.streams_reset + stats.streams_aborted
        assert stats.streams_opened == ended + connection.open_streams, (connection, stats)
        assert len(connection.stream_ids()) == connection.open_streams
