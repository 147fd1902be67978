"""Hostile input: random bytes and mutated valid messages raise only ProtocolError.

Whatever arrives, ``receive_data`` either returns events or raises a
:class:`ProtocolError` subclass; a connection it fails is closed with a GOAWAY
queued; and the connection can still produce its output afterwards.
"""

from __future__ import annotations

from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import (
    Connection,
    ErrorCode,
    Limits,
    ProtocolError,
    RemoteProtocolError,
    Side,
)
from protocol.frames import (
    DataFrame,
    Frame,
    GoAwayFrame,
    MessageFrame,
    OpenFrame,
    PingFrame,
    PongFrame,
    ResetFrame,
    WindowFrame,
    encode_message,
)
from protocol.limits import MAX_STREAM_ID, MAX_WINDOW

from .pair import assert_accounted, decode_all, feed, handshaken, hello

FUZZ = settings(
    max_examples=1000,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

LIMITS = Limits(max_header_size=1024, initial_window=4096, connection_window=8192, max_streams=4)


def target(state: str) -> Connection:
    """A server in the handshake, or open with streams 1 and 3 (the peer's) and 2 (its own)."""
    if state == "handshake":
        server = Connection(Side.SERVER, LIMITS)
        server.data_to_send()
        return server
    server = handshaken(limits=LIMITS)
    feed(server, OpenFrame(1, "http", {}), OpenFrame(3, "command", {}), DataFrame(1, b"abc"))
    server.open_stream("command")
    server.data_to_send()
    return server


#: Frames that are valid against ``target("open")``, for mutation.
VALID: list[list[Frame]] = [
    [DataFrame(1, b"payload"), DataFrame(3, b"", end_stream=True)],
    [WindowFrame(0, 100), WindowFrame(2, 100)],
    [ResetFrame(3, ErrorCode.CANCEL, "bye")],
    [OpenFrame(5, "http", {"method": "GET", "path": "/api"}, end_stream=True)],
    [PingFrame(7), PongFrame(1)],
    [MessageFrame("cert.renew", {"csr": "PEM"})],
    [GoAwayFrame(2, ErrorCode.NO_ERROR, "drain")],
    [DataFrame(1, b"x" * 100), WindowFrame(1, 1), PingFrame(0), ResetFrame(1, 0x100, "")],
]

BOUNDARY_INTS = st.sampled_from(
    [0, 1, 2, 3, 4, 5, 9, 10, -1, 255, 2**16, MAX_STREAM_ID, MAX_WINDOW, 2**32, 2**64 - 1]
)
#: Payloads at and over the target's stream credit, connection credit and frame size.
BIG_BINARY = st.sampled_from([b"\0" * size for size in (4096, 4097, 8193, 64 * 1024 + 1)])
LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    BOUNDARY_INTS,
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.binary(max_size=8),
)
ANY_VALUE = st.recursive(
    LEAVES,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.text(max_size=4), children, max_size=3),
    ),
    max_leaves=8,
)
#: Mostly integers at the edges of the fields' ranges, where validation must hold.
VALUES = st.one_of(BOUNDARY_INTS, BIG_BINARY, ANY_VALUE)


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every position inside a decoded message: list indexes and map values."""
    found = [prefix]
    if isinstance(value, list):
        for index, item in enumerate(value):
            found.extend(paths(item, (*prefix, index)))
    elif isinstance(value, dict):
        for key, item in value.items():
            found.extend(paths(item, (*prefix, key)))
    return found


def replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, list):
        return [replaced(v, rest, new) if i == head else v for i, v in enumerate(value)]
    assert isinstance(value, dict)
    return {k: replaced(v, rest, new) if k == head else v for k, v in value.items()}


def check_survives(connection: Connection, message: bytes) -> None:
    """Feed a message: events, or a ProtocolError and a failed connection; never a crash."""
    opened = connection.stats.streams_opened
    error: ProtocolError | None = None
    try:
        connection.receive_data(message, 0.0)
    except ProtocolError as exc:
        error = exc
    answer = decode_all(connection.data_to_send())  # whatever it answers is well-formed
    if isinstance(error, RemoteProtocolError):
        assert connection.closed
        assert [f.code for f in answer if isinstance(f, GoAwayFrame)] == [error.code]
    elif error is not None:
        assert connection.closed
    assert connection.stats.streams_opened >= opened
    assert_accounted(connection)


@FUZZ
@given(state=st.sampled_from(["handshake", "open"]), message=st.binary(max_size=512))
def test_random_bytes_raise_only_protocol_errors(state: str, message: bytes) -> None:
    check_survives(target(state), message)


@FUZZ
@given(
    frames=st.sampled_from(VALID),
    cut=st.one_of(st.just(0), st.integers(min_value=1, max_value=200)),
    flips=st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), max_size=3),
)
def test_damaged_valid_messages_raise_only_protocol_errors(
    frames: list[Frame], cut: int, flips: list[tuple[int, int]]
) -> None:
    message = bytearray(encode_message(frames))
    for position, value in flips:
        if message:
            message[position % len(message)] = value
    check_survives(target("open"), bytes(message[: len(message) - cut % (len(message) + 1)]))


@FUZZ
@given(frames=st.sampled_from(VALID), data=st.data())
def test_mutated_valid_frames_raise_only_protocol_errors(
    frames: list[Frame], data: st.DataObject
) -> None:
    items = msgpack.unpackb(encode_message(frames), raw=False)
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        path = data.draw(st.sampled_from(paths(items)), label="path")
        action = data.draw(st.sampled_from(["replace", "drop", "append"]), label="action")
        if action == "replace" or not path:
            items = replaced(items, path, data.draw(VALUES, label="value"))
            continue
        parent_path, last = path[:-1], path[-1]
        parent = items
        for step in parent_path:
            parent = parent[step]
        if isinstance(parent, list):
            changed = list(parent)
            if action == "drop":
                del changed[last]
            else:
                changed.append(data.draw(VALUES, label="extra"))
            items = replaced(items, parent_path, changed)
    try:
        message = msgpack.packb(items)
    except (TypeError, ValueError, OverflowError):
        return  # not encodable: no peer could send it
    check_survives(target("open"), message)


@FUZZ
@given(data=st.data())
def test_mutated_hellos_raise_only_protocol_errors(data: st.DataObject) -> None:
    items = msgpack.unpackb(encode_message([hello(LIMITS, capabilities=["exec"])]), raw=False)
    path = data.draw(st.sampled_from(paths(items)), label="path")
    mutated = replaced(items, path, data.draw(VALUES, label="value"))
    check_survives(target("handshake"), msgpack.packb(mutated))
