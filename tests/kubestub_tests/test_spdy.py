"""SPDY/3.1 framing as spdystream (kubectl's port-forward client) writes and reads it."""

from __future__ import annotations

import struct
import zlib

import pytest

from tests.kubestub.spdy import (
    DICTIONARY,
    DataFrame,
    GoAway,
    Ignored,
    Ping,
    RstStream,
    SpdyConnection,
    SpdyError,
    SynStream,
)


class Client:
    """The client half: one header compressor for the connection, as spdystream keeps."""

    def __init__(self) -> None:
        self.deflate = zlib.compressobj(
            9, zlib.DEFLATED, 15, 8, zlib.Z_DEFAULT_STRATEGY, DICTIONARY
        )
        self.inflate = zlib.decompressobj(zdict=DICTIONARY)

    def headers(self, headers: dict[str, str]) -> bytes:
        block = struct.pack("!I", len(headers))
        for name, value in headers.items():
            block += struct.pack("!I", len(name)) + name.encode()
            block += struct.pack("!I", len(value)) + value.encode()
        return self.deflate.compress(block) + self.deflate.flush(zlib.Z_SYNC_FLUSH)

    def syn_stream(self, stream_id: int, headers: dict[str, str]) -> bytes:
        payload = struct.pack("!IIBB", stream_id, 0, 0, 0) + self.headers(headers)
        return struct.pack("!HHI", 0x8003, 1, len(payload)) + payload


def _control(frame_type: int, payload: bytes, flags: int = 0) -> bytes:
    return struct.pack("!HHI", 0x8003, frame_type, (flags << 24) | len(payload)) + payload


def test_dictionary_is_the_spdy3_one() -> None:
    assert len(DICTIONARY) == 1423
    assert zlib.adler32(DICTIONARY) == 0xE3C6A7C2


def test_syn_streams_decode_across_arbitrary_splits_with_one_header_stream() -> None:
    client = Client()
    wire = client.syn_stream(1, {"streamtype": "error", "port": "80", "requestid": "0"})
    wire += client.syn_stream(3, {"streamtype": "data", "port": "80", "requestid": "0"})
    server = SpdyConnection()
    frames = []
    for index in range(len(wire)):
        frames += server.receive_data(wire[index : index + 1])
    assert frames == [
        SynStream(1, {"streamtype": ["error"], "port": ["80"], "requestid": ["0"]}, False),
        SynStream(3, {"streamtype": ["data"], "port": ["80"], "requestid": ["0"]}, False),
    ]
    assert isinstance(frames[1], SynStream)
    assert frames[1].header("StreamType") == "data"


def test_replies_and_data_are_what_spdystream_reads() -> None:
    client = Client()
    server = SpdyConnection()
    server.syn_reply(1)
    server.syn_reply(3)
    server.data(3, b"payload")
    server.data(3, b"", fin=True)
    out = server.data_to_send()
    for stream_id in (1, 3):
        head, length = struct.unpack_from("!II", out)
        assert head == 0x80030002
        assert struct.unpack_from("!I", out, 8)[0] == stream_id
        assert client.inflate.decompress(out[12 : 8 + (length & 0xFFFFFF)]) == b"\0\0\0\0"
        out = out[8 + (length & 0xFFFFFF) :]
    assert out == struct.pack("!II", 3, 7) + b"payload" + struct.pack("!II", 3, 0x01000000)


def test_control_frames_decode() -> None:
    server = SpdyConnection()
    wire = (
        _control(6, struct.pack("!I", 7))
        + _control(3, struct.pack("!II", 5, 5))
        + _control(4, struct.pack("!I", 0))
        + _control(7, struct.pack("!II", 5, 0))
        + struct.pack("!II", 5, 0x01000002)
        + b"hi"
    )
    assert server.receive_data(wire) == [
        Ping(7),
        RstStream(5, 5),
        Ignored(4),
        GoAway(5, 0),
        DataFrame(5, b"hi", True),
    ]
    server.ping(7)
    assert server.data_to_send() == _control(6, struct.pack("!I", 7))


@pytest.mark.parametrize(
    "wire",
    [
        pytest.param(struct.pack("!HHI", 0x8002, 6, 4) + b"\0\0\0\1", id="version-2"),
        pytest.param(_control(99, b""), id="unknown-type"),
        pytest.param(struct.pack("!II", 0, 1) + b"x", id="data-on-stream-0"),
        pytest.param(_control(1, b"\0" * 10 + b"not zlib"), id="bad-header-block"),
        pytest.param(struct.pack("!II", 1, (1 << 20) + 1), id="oversized"),
    ],
)
def test_malformed_frames_are_protocol_errors(wire: bytes) -> None:
    with pytest.raises(SpdyError):
        SpdyConnection().receive_data(wire)
