"""Frames: every type survives encode and decode; decoding validates every field."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import FrameSizeError, Limits, MalformedFrameError
from protocol.frames import (
    END_STREAM,
    DataFrame,
    Frame,
    FrameType,
    GoAwayFrame,
    HelloFrame,
    MessageFrame,
    OpenFrame,
    PingFrame,
    PongFrame,
    ResetFrame,
    WindowFrame,
    data_to_wire,
    decode_message,
    encode_message,
    encode_wire,
    encoded_size,
    to_wire,
)
from protocol.limits import MAX_STREAM_ID, MAX_WINDOW

EVERY_FRAME: list[Frame] = [
    HelloFrame(1, 3, Limits(max_streams=9), frozenset({"exec"}), {"cluster": "c1"}),
    OpenFrame(1, "http", {"method": "GET", "headers": [["a", "b"]]}, end_stream=True),
    DataFrame(MAX_STREAM_ID, b"\x00payload", end_stream=True),
    DataFrame(2, b""),
    ResetFrame(3, 0xFFFF_FFFF, "why"),
    WindowFrame(0, MAX_WINDOW),
    PingFrame(2**64 - 1),
    PongFrame(0),
    GoAwayFrame(7, 0, "bye"),
    MessageFrame("cert.renew", {"csr": b"der"}),
]


@pytest.mark.parametrize("frame", EVERY_FRAME, ids=lambda frame: type(frame).__name__)
def test_every_frame_type_round_trips(frame: Frame) -> None:
    assert decode_message(encode_message([frame]), Limits()) == [frame]


def test_a_message_carries_many_frames_in_order() -> None:
    assert decode_message(encode_message(EVERY_FRAME), Limits()) == EVERY_FRAME


@given(
    before=st.lists(st.sampled_from([to_wire(frame) for frame in EVERY_FRAME[1:]]), max_size=20),
    stream_id=st.sampled_from([1, 127, 128, 255, 256, 65535, 65536, MAX_STREAM_ID]),
    size=st.sampled_from([0, 4095, 4096, 65535, 65536, 65537, 300_000]),
    end_stream=st.booleans(),
    view=st.booleans(),
)
def test_a_message_is_the_msgpack_encoding_of_its_frames(
    before: list[tuple[Any, ...]], stream_id: int, size: int, end_stream: bool, view: bool
) -> None:
    # Large payloads are spliced into their message by hand: the bytes must
    # still be exactly msgpack's, whatever the id, size, flags and frames before.
    payload = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    items = [*before, data_to_wire(stream_id, memoryview(payload) if view else payload, end_stream)]

    assert encode_wire(items) == msgpack.packb(items)


@pytest.mark.parametrize("end_stream", [False, True])
def test_data_built_in_wire_form_equals_a_data_frame(end_stream: bool) -> None:
    frame = DataFrame(5, b"abc", end_stream)

    assert data_to_wire(5, b"abc", end_stream) == to_wire(frame)
    assert encode_wire([data_to_wire(5, b"abc", end_stream)]) == encode_message([frame])


def test_memoryview_payloads_encode_like_bytes() -> None:
    data = memoryview(b"0123456789")[2:5]
    assert decode_message(encode_message([DataFrame(1, data)]), Limits()) == [DataFrame(1, b"234")]


@pytest.mark.parametrize("frame", EVERY_FRAME, ids=lambda frame: type(frame).__name__)
def test_encoded_size_is_an_upper_bound(frame: Frame) -> None:
    assert len(encode_message([frame])) <= encoded_size(frame) + 5


def test_frame_types_are_numbered_as_documented() -> None:
    assert [(t.name, t.value) for t in FrameType] == [
        ("HELLO", 1),
        ("OPEN", 2),
        ("DATA", 3),
        ("RESET", 4),
        ("WINDOW", 5),
        ("PING", 6),
        ("PONG", 7),
        ("GOAWAY", 8),
        ("MESSAGE", 9),
    ]
    assert END_STREAM == 1


def _hello_body(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "versions": [1, 1],
        "limits": Limits().to_wire(),
        "capabilities": [],
        "info": {},
    }
    body.update(changes)
    return body


MALFORMED: list[tuple[str, Any]] = [
    ("not an array", {"type": 3}),
    ("empty message", []),
    ("frame not an array", [3]),
    ("empty frame", [[]]),
    ("type not an integer", [["3", 1, b"", 0]]),
    ("type a boolean", [[True, 1]]),
    ("DATA type a float", [[3.0, 1, b"", 0]]),
    ("unknown type", [[99, 1, 2]]),
    ("type zero", [[0]]),
    ("DATA short", [[3, 1, b""]]),
    ("DATA long", [[3, 1, b"", 0, 0]]),
    ("DATA text payload", [[3, 1, "text", 0]]),
    ("DATA stream zero", [[3, 0, b"", 0]]),
    ("DATA stream too large", [[3, MAX_STREAM_ID + 1, b"", 0]]),
    ("DATA stream negative", [[3, -1, b"", 0]]),
    ("DATA stream a float", [[3, 1.0, b"", 0]]),
    ("DATA unknown flag", [[3, 1, b"", 2]]),
    ("DATA negative flags", [[3, 1, b"", -1]]),
    ("DATA flags a boolean", [[3, 1, b"", True]]),
    ("OPEN headers a list", [[2, 1, "http", [], 0]]),
    ("OPEN empty kind", [[2, 1, "", {}, 0]]),
    ("OPEN long kind", [[2, 1, "k" * 65, {}, 0]]),
    ("OPEN kind binary", [[2, 1, b"http", {}, 0]]),
    ("RESET code negative", [[4, 1, -1, ""]]),
    ("RESET code too large", [[4, 1, 2**32, ""]]),
    ("RESET reason binary", [[4, 1, 0, b"why"]]),
    ("RESET reason too long", [[4, 1, 0, "x" * 1025]]),
    ("WINDOW increment zero", [[5, 1, 0]]),
    ("WINDOW increment too large", [[5, 1, MAX_WINDOW + 1]]),
    ("WINDOW stream negative", [[5, -1, 1]]),
    ("PING negative", [[6, -1]]),
    ("PING text", [[6, "x"]]),
    ("PONG missing data", [[7]]),
    ("GOAWAY last negative", [[8, -1, 0, ""]]),
    ("GOAWAY code a float", [[8, 0, 0.0, ""]]),
    ("MESSAGE body a list", [[9, "kind", []]]),
    ("MESSAGE kind an integer", [[9, 1, {}]]),
    ("HELLO body a list", [[1, []]]),
    ("HELLO without versions", [[1, {"limits": Limits().to_wire()}]]),
    ("HELLO versions reversed", [[1, _hello_body(versions=[2, 1])]]),
    ("HELLO version zero", [[1, _hello_body(versions=[0, 1])]]),
    ("HELLO versions of three", [[1, _hello_body(versions=[1, 1, 1])]]),
    ("HELLO capabilities a map", [[1, _hello_body(capabilities={})]]),
    ("HELLO capability an integer", [[1, _hello_body(capabilities=[1])]]),
    ("HELLO too many capabilities", [[1, _hello_body(capabilities=["c"] * 65)]]),
    ("HELLO info a list", [[1, _hello_body(info=[])]]),
    ("HELLO limits missing", [[1, _hello_body(limits=None)]]),
    (
        "HELLO limits out of range",
        [[1, _hello_body(limits={**Limits().to_wire(), "max_streams": 0})]],
    ),
    ("HELLO extra item", [[1, _hello_body(), 1]]),
]


@pytest.mark.parametrize(("case", "items"), MALFORMED, ids=[case for case, _ in MALFORMED])
def test_malformed_frames_are_refused(case: str, items: Any) -> None:
    with pytest.raises(MalformedFrameError):
        decode_message(msgpack.packb(items), Limits())


@pytest.mark.parametrize(
    "data",
    [b"", b"\xc1", b"\x91", b"\x94\x03\x01\xc4\x10abc", b"\x91\x92\x06\x01\x00", b"\x92\xa1\xff"],
    ids=["nothing", "reserved byte", "truncated array", "truncated bin", "extra bytes", "bad utf8"],
)
def test_bytes_that_are_not_msgpack_are_malformed(data: bytes) -> None:
    with pytest.raises(MalformedFrameError):
        decode_message(data, Limits())


def test_maps_with_non_string_keys_are_malformed() -> None:
    with pytest.raises(MalformedFrameError):
        decode_message(msgpack.packb([[9, "kind", {1: 2}]]), Limits())


def test_a_payload_over_max_frame_size_is_a_frame_size_error() -> None:
    limits = Limits(max_frame_size=16 * 1024, max_header_size=1024)
    decode_message(encode_message([DataFrame(1, b"x" * 16 * 1024)]), limits)

    with pytest.raises(FrameSizeError):
        decode_message(encode_message([DataFrame(1, b"x" * (16 * 1024 + 1))]), limits)
