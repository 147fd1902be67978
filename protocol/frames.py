"""Frames and their msgpack encoding (docs/protocol.md, "Frames").

One WebSocket binary message carries a batch of whole frames: a msgpack array
whose items are frames, each itself an array ``[type, ...fields]``. A frame
never spans two messages. :func:`encode_message` and :func:`decode_message`
convert between a list of frame objects and one message.

Decoding validates every field's type and range, so the connection only ever
sees well-formed frames; anything else is a :class:`MalformedFrameError`.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from .errors import FrameSizeError, MalformedFrameError
from .limits import MAX_STREAM_ID, MAX_WINDOW, Limits

__all__ = [
    "END_STREAM",
    "MAX_CAPABILITIES",
    "MAX_KIND_LENGTH",
    "MAX_REASON_LENGTH",
    "DataFrame",
    "Frame",
    "FrameType",
    "GoAwayFrame",
    "HelloFrame",
    "MessageFrame",
    "OpenFrame",
    "PingFrame",
    "PongFrame",
    "ResetFrame",
    "WindowFrame",
    "WireItem",
    "data_to_wire",
    "decode_message",
    "encode_message",
    "encode_wire",
    "encoded_size",
    "to_wire",
]

#: Flag bit on OPEN and DATA: the sender will send no more data on this stream.
END_STREAM = 0x1
_KNOWN_FLAGS = END_STREAM
#: Stream kinds and message kinds are short ASCII-ish names.
MAX_KIND_LENGTH = 64
#: Reasons in RESET and GOAWAY are short; longer ones are cut when sent.
MAX_REASON_LENGTH = 256
#: Largest HELLO ``info`` map, encoded.
MAX_INFO_SIZE = 8 * 1024
#: Most capability names in a HELLO.
MAX_CAPABILITIES = 64
_MAX_PING_DATA = 2**64 - 1


class FrameType(enum.IntEnum):
    """The first item of every frame."""

    HELLO = 1
    OPEN = 2
    DATA = 3
    RESET = 4
    WINDOW = 5
    PING = 6
    PONG = 7
    GOAWAY = 8
    MESSAGE = 9


@dataclass(frozen=True, slots=True)
class HelloFrame:
    """Opens the connection: versions spoken, limits, capabilities, identity claims."""

    min_version: int
    max_version: int
    limits: Limits
    capabilities: frozenset[str] = frozenset()
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, init=False)
class OpenFrame:
    """Opens a stream of a kind (``http``, ``command`` ...) with a header map."""

    stream_id: int
    kind: str
    headers: dict[str, Any]
    end_stream: bool

    def __init__(
        self, stream_id: int, kind: str, headers: dict[str, Any], end_stream: bool = False
    ) -> None:
        object.__setattr__(self, "stream_id", stream_id)
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "headers", headers)
        object.__setattr__(self, "end_stream", end_stream)


@dataclass(frozen=True, slots=True, init=False)
class DataFrame:
    """Bytes of a stream; ``end_stream`` half-closes the sender's direction."""

    stream_id: int
    data: bytes | memoryview
    end_stream: bool

    def __init__(self, stream_id: int, data: bytes | memoryview, end_stream: bool = False) -> None:
        object.__setattr__(self, "stream_id", stream_id)
        object.__setattr__(self, "data", data)
        object.__setattr__(self, "end_stream", end_stream)


@dataclass(frozen=True, slots=True, init=False)
class ResetFrame:
    """Ends a stream abruptly in both directions."""

    stream_id: int
    code: int
    reason: str

    def __init__(self, stream_id: int, code: int, reason: str = "") -> None:
        object.__setattr__(self, "stream_id", stream_id)
        object.__setattr__(self, "code", code)
        object.__setattr__(self, "reason", reason)


@dataclass(frozen=True, slots=True, init=False)
class WindowFrame:
    """Gives the peer more credit on a stream, or on the connection (stream 0)."""

    stream_id: int
    increment: int

    def __init__(self, stream_id: int, increment: int) -> None:
        object.__setattr__(self, "stream_id", stream_id)
        object.__setattr__(self, "increment", increment)


@dataclass(frozen=True, slots=True, init=False)
class PingFrame:
    """Asks for a PONG carrying the same opaque number."""

    opaque: int

    def __init__(self, opaque: int) -> None:
        object.__setattr__(self, "opaque", opaque)


@dataclass(frozen=True, slots=True, init=False)
class PongFrame:
    """Answers a PING."""

    opaque: int

    def __init__(self, opaque: int) -> None:
        object.__setattr__(self, "opaque", opaque)


@dataclass(frozen=True, slots=True, init=False)
class GoAwayFrame:
    """No stream above ``last_stream_id`` opened by the receiver will be served."""

    last_stream_id: int
    code: int
    reason: str

    def __init__(self, last_stream_id: int, code: int, reason: str = "") -> None:
        object.__setattr__(self, "last_stream_id", last_stream_id)
        object.__setattr__(self, "code", code)
        object.__setattr__(self, "reason", reason)


@dataclass(frozen=True, slots=True, init=False)
class MessageFrame:
    """A connection-level control message (commands, certificate renewal ...)."""

    kind: str
    body: dict[str, Any]

    def __init__(self, kind: str, body: dict[str, Any]) -> None:
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "body", body)


Frame = (
    HelloFrame
    | OpenFrame
    | DataFrame
    | ResetFrame
    | WindowFrame
    | PingFrame
    | PongFrame
    | GoAwayFrame
    | MessageFrame
)


#: One frame as msgpack carries it: ``(type, ...fields)``.
WireItem = tuple[Any, ...]


def to_wire(frame: Frame) -> WireItem:
    """The frame as msgpack carries it."""
    # Ordered by frequency: DATA and WINDOW dominate.
    if type(frame) is DataFrame:
        return (3, frame.stream_id, frame.data, END_STREAM if frame.end_stream else 0)
    if type(frame) is WindowFrame:
        return (5, frame.stream_id, frame.increment)
    if type(frame) is OpenFrame:
        return (
            2,
            frame.stream_id,
            frame.kind,
            frame.headers,
            END_STREAM if frame.end_stream else 0,
        )
    if type(frame) is ResetFrame:
        return (4, frame.stream_id, frame.code, frame.reason)
    if type(frame) is PingFrame:
        return (6, frame.opaque)
    if type(frame) is PongFrame:
        return (7, frame.opaque)
    if type(frame) is MessageFrame:
        return (9, frame.kind, frame.body)
    if type(frame) is GoAwayFrame:
        return (8, frame.last_stream_id, frame.code, frame.reason)
    assert isinstance(frame, HelloFrame)
    return (
        1,
        {
            "versions": [frame.min_version, frame.max_version],
            "limits": frame.limits.to_wire(),
            "capabilities": sorted(frame.capabilities),
            "info": frame.info,
        },
    )


def data_to_wire(stream_id: int, data: bytes | memoryview, end_stream: bool) -> WireItem:
    """A DATA frame as msgpack carries it, built from its fields.

    Equal to ``to_wire(DataFrame(stream_id, data, end_stream))``; the sending
    hot path uses it to skip building a frame object it would only take apart.
    """
    return (3, stream_id, data, END_STREAM if end_stream else 0)


def encode_message(frames: Sequence[Frame]) -> bytes:
    """Encode frames as one message (a msgpack array of frames)."""
    return encode_wire([to_wire(frame) for frame in frames])


def encode_wire(items: Sequence[WireItem]) -> bytes:
    """Encode frames already in their wire form (see :func:`to_wire`) as one message."""
    last = items[-1]
    if last[0] == 3 and len(last[2]) >= _SPLICE_MIN:
        # A large payload ends the message (a download's frames): it is copied
        # once, into the message, instead of into msgpack's buffer and then
        # out of it. The bytes are those msgpack would write.
        _, stream_id, payload, flags = last
        size = len(payload)
        return b"".join(
            (
                _array_header(len(items)),
                *map(msgpack.packb, items[:-1]),
                _DATA_START,
                msgpack.packb(stream_id),
                _TAG_U16.pack(0xC5, size) if size < 0x10000 else _TAG_U32.pack(0xC6, size),
                payload,
                msgpack.packb(flags),
            )
        )
    return msgpack.packb(items)  # type: ignore[no-any-return]


#: Payloads from this size are spliced into their message (see encode_wire).
_SPLICE_MIN = 4096
_DATA_START = b"\x94\x03"  # an array of 4, then the type 3 (DATA)
# A msgpack type byte followed by a 16- or 32-bit length (bin and array headers).
_TAG_U16 = struct.Struct(">BH")
_TAG_U32 = struct.Struct(">BI")


def _array_header(length: int) -> bytes:
    if length < 16:
        return bytes((0x90 | length,))
    if length < 0x10000:
        return _TAG_U16.pack(0xDC, length)
    return _TAG_U32.pack(0xDD, length)


def encoded_size(frame: Frame) -> int:
    """An upper bound of the frame's encoded size, for batching.

    Exact sizes would need encoding; DATA (the frequent case) is bounded
    arithmetically, the rest are small or were measured when queued.
    """
    if type(frame) is DataFrame:
        return len(frame.data) + 16
    if type(frame) in (WindowFrame, PingFrame, PongFrame):
        return 24
    return len(encode_message([frame]))


_UNPACK_ERRORS = (ValueError, TypeError, OverflowError, msgpack.UnpackException)


def decode_message(data: bytes, limits: Limits) -> list[Frame]:
    """Decode one message into frames, validating each against ``limits``.

    Raises :class:`FrameSizeError` for a message or payload over the limits and
    :class:`MalformedFrameError` for anything else that is not a valid frame.
    """
    if len(data) > limits.message_limit:
        raise FrameSizeError(
            f"message of {len(data)} bytes exceeds the limit of {limits.message_limit}"
        )
    try:
        items = msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True)
    except _UNPACK_ERRORS as exc:
        raise MalformedFrameError(f"message is not valid msgpack: {exc}") from exc
    if type(items) is not list or not items:
        raise MalformedFrameError("a message must be a non-empty array of frames")
    frames: list[Frame] = []
    max_payload = limits.max_frame_size
    for item in items:
        # The frequent case, a well-formed DATA frame, is checked inline; all
        # else (malformed DATA included, for its precise error) takes the full path.
        if type(item) is list and len(item) == 4:
            frame_type, stream_id, payload, flags = item
            if (
                frame_type == 3
                and type(frame_type) is int
                and type(stream_id) is int
                and 0 < stream_id <= MAX_STREAM_ID
                and type(payload) is bytes
                and len(payload) <= max_payload
                and type(flags) is int
                and (flags == 0 or flags == END_STREAM)
            ):
                frames.append(DataFrame(stream_id, payload, flags == END_STREAM))
                continue
        frames.append(_from_wire(item, limits))
    return frames


def _from_wire(item: Any, limits: Limits) -> Frame:
    if type(item) is not list or not item or type(item[0]) is not int:
        raise MalformedFrameError("a frame must be an array starting with its type")
    frame_type = item[0]
    if frame_type == 3:
        _arity(item, 4, "DATA")
        data = item[2]
        if type(data) is not bytes:
            raise MalformedFrameError("DATA payload must be binary")
        if len(data) > limits.max_frame_size:
            raise FrameSizeError(
                f"DATA payload of {len(data)} bytes exceeds max_frame_size {limits.max_frame_size}"
            )
        return DataFrame(_stream_id(item[1], "DATA"), data, _flags(item[3], "DATA"))
    if frame_type == 5:
        _arity(item, 3, "WINDOW")
        stream_id = item[1]
        if type(stream_id) is not int or not 0 <= stream_id <= MAX_STREAM_ID:
            raise MalformedFrameError("WINDOW stream id must be 0..2**31-1")
        increment = item[2]
        if type(increment) is not int or not 1 <= increment <= MAX_WINDOW:
            raise MalformedFrameError("WINDOW increment must be 1..2**31-1")
        return WindowFrame(stream_id, increment)
    if frame_type == 2:
        _arity(item, 5, "OPEN")
        headers = item[3]
        if type(headers) is not dict:
            raise MalformedFrameError("OPEN headers must be a map")
        return OpenFrame(
            _stream_id(item[1], "OPEN"),
            _kind(item[2], "OPEN"),
            headers,
            _flags(item[4], "OPEN"),
        )
    if frame_type == 4:
        _arity(item, 4, "RESET")
        return ResetFrame(
            _stream_id(item[1], "RESET"), _code(item[2], "RESET"), _reason(item[3], "RESET")
        )
    if frame_type in (6, 7):
        name = "PING" if frame_type == 6 else "PONG"
        _arity(item, 2, name)
        opaque = item[1]
        if type(opaque) is not int or not 0 <= opaque <= _MAX_PING_DATA:
            raise MalformedFrameError(f"{name} data must be an unsigned 64-bit integer")
        return PingFrame(opaque) if frame_type == 6 else PongFrame(opaque)
    if frame_type == 8:
        _arity(item, 4, "GOAWAY")
        last = item[1]
        if type(last) is not int or not 0 <= last <= MAX_STREAM_ID:
            raise MalformedFrameError("GOAWAY last stream id must be 0..2**31-1")
        return GoAwayFrame(last, _code(item[2], "GOAWAY"), _reason(item[3], "GOAWAY"))
    if frame_type == 9:
        _arity(item, 3, "MESSAGE")
        body = item[2]
        if type(body) is not dict:
            raise MalformedFrameError("MESSAGE body must be a map")
        return MessageFrame(_kind(item[1], "MESSAGE"), body)
    if frame_type == 1:
        return _hello_from_wire(item)
    raise MalformedFrameError(f"unknown frame type {frame_type}")


def _hello_from_wire(item: list[Any]) -> HelloFrame:
    # The HELLO keeps this shape in every version, so that any two versions
    # can read each other's and refuse cleanly (docs/protocol.md, "Versioning").
    _arity(item, 2, "HELLO")
    body = item[1]
    if type(body) is not dict:
        raise MalformedFrameError("HELLO body must be a map")
    versions = body.get("versions")
    if (
        type(versions) is not list
        or len(versions) != 2
        or not all(type(v) is int and 0 < v < 2**16 for v in versions)
        or versions[0] > versions[1]
    ):
        raise MalformedFrameError("HELLO versions must be [min, max] with 0 < min <= max")
    capabilities = body.get("capabilities", [])
    if (
        type(capabilities) is not list
        or len(capabilities) > MAX_CAPABILITIES
        or not all(type(c) is str and len(c) <= MAX_KIND_LENGTH for c in capabilities)
    ):
        raise MalformedFrameError("HELLO capabilities must be a short list of names")
    info = body.get("info", {})
    if type(info) is not dict:
        raise MalformedFrameError("HELLO info must be a map")
    if len(msgpack.packb(info)) > MAX_INFO_SIZE:
        raise MalformedFrameError(f"HELLO info is larger than {MAX_INFO_SIZE} bytes")
    return HelloFrame(
        versions[0],
        versions[1],
        Limits.from_wire(body.get("limits")),
        frozenset(capabilities),
        info,
    )


def _arity(item: list[Any], size: int, name: str) -> None:
    if len(item) != size:
        raise MalformedFrameError(f"{name} frame must have {size} items, not {len(item)}")


def _stream_id(value: Any, name: str) -> int:
    if type(value) is not int or not 1 <= value <= MAX_STREAM_ID:
        raise MalformedFrameError(f"{name} stream id must be 1..2**31-1")
    return value


def _flags(value: Any, name: str) -> bool:
    if type(value) is not int or value & ~_KNOWN_FLAGS or value < 0:
        raise MalformedFrameError(f"{name} flags must be 0 or {END_STREAM}")
    return bool(value & END_STREAM)


def _kind(value: Any, name: str) -> str:
    if type(value) is not str or not 0 < len(value) <= MAX_KIND_LENGTH:
        raise MalformedFrameError(f"{name} kind must be a name of 1..{MAX_KIND_LENGTH} characters")
    return value


def _code(value: Any, name: str) -> int:
    if type(value) is not int or not 0 <= value < 2**32:
        raise MalformedFrameError(f"{name} code must be an unsigned 32-bit integer")
    return value


def _reason(value: Any, name: str) -> str:
    if type(value) is not str or len(value) > 4 * MAX_REASON_LENGTH:
        raise MalformedFrameError(f"{name} reason must be a short string")
    return value
