"""Following WebSocket frames in relayed bytes, and the close frame the server adds."""

from __future__ import annotations

import pytest

from tunnel_server.proxy.wsframes import CLOSE_POLICY, FrameBoundary, close_frame


def frame(payload: bytes, *, opcode: int = 0x2, masked: bool = False) -> bytes:
    length = len(payload)
    mask_bit = 0x80 if masked else 0
    if length < 126:
        header = bytes((0x80 | opcode, mask_bit | length))
    elif length < 65536:
        header = bytes((0x80 | opcode, mask_bit | 126)) + length.to_bytes(2, "big")
    else:
        header = bytes((0x80 | opcode, mask_bit | 127)) + length.to_bytes(8, "big")
    if masked:
        key = b"\x01\x02\x03\x04"
        payload = bytes(byte ^ key[i % 4] for i, byte in enumerate(payload))
        header += key
    return header + payload


FRAMES = [
    frame(b""),
    frame(b"\x01stdout"),
    frame(b"x" * 125),
    frame(b"y" * 126),
    frame(b"z" * 70_000),
    frame(b"masked", masked=True),
    frame(b"", opcode=0x9),  # a ping
]


def test_nothing_relayed_is_a_boundary() -> None:
    assert FrameBoundary().at_boundary


@pytest.mark.parametrize("index", range(len(FRAMES)))
def test_a_frame_fed_whole_ends_on_a_boundary_and_not_before(index: int) -> None:
    data = FRAMES[index]
    for cut in range(1, len(data)):
        boundary = FrameBoundary()
        boundary.feed(data[:cut])
        assert not boundary.at_boundary, cut
        boundary.feed(data[cut:])
        assert boundary.at_boundary, cut


def test_frames_fed_in_arbitrary_pieces_are_followed() -> None:
    data = b"".join(FRAMES)
    ends = set()
    total = 0
    for one in FRAMES:
        total += len(one)
        ends.add(total)
    boundary = FrameBoundary()
    position = 0
    for size in [1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 1000, 50_000] * 10:
        if position >= len(data):
            break
        boundary.feed(data[position : position + size])
        position = min(position + size, len(data))
        assert boundary.at_boundary == (position in ends), position


def test_a_close_frame_carries_its_code_and_reason() -> None:
    assert close_frame(CLOSE_POLICY, "access revoked") == (
        b"\x88\x10" + (1008).to_bytes(2, "big") + b"access revoked"
    )


def test_a_long_reason_is_cut_to_fit_and_on_a_whole_character() -> None:
    reason = "é" * 100  # 200 bytes
    data = close_frame(CLOSE_POLICY, reason)
    assert data[1] <= 125
    assert data[4:].decode() == "é" * 61  # 122 bytes: a 123rd would split a character
