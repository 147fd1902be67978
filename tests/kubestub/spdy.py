"""SPDY/3.1 framing, server side and sans-I/O: what ``kubectl port-forward`` tunnels.

Since Kubernetes 1.31 kubectl carries the SPDY port-forward protocol inside
a WebSocket (subprotocol ``SPDY/3.1+portforward.k8s.io``): the binary
messages are a plain byte stream of SPDY frames, exactly as moby/spdystream
writes them on a TCP connection. This module turns bytes into frames and
frames into bytes; :mod:`tests.kubestub.portforward` does the I/O.

Frames (draft-mbelshe-httpbis-spdy-00, version 3): a control frame is
``1 | version:15 | type:16 | flags:8 | length:24`` then its payload; a data
frame ``0 | stream-id:31 | flags:8 | length:24`` then its data. Header
blocks (SYN_STREAM, SYN_REPLY, HEADERS) are ``count:32`` then
``len:32 name len:32 value`` pairs, zlib-compressed with one stream per
direction for the whole connection, primed with :data:`DICTIONARY`.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

__all__ = [
    "DICTIONARY",
    "DataFrame",
    "Frame",
    "GoAway",
    "Ignored",
    "Ping",
    "RstStream",
    "SpdyConnection",
    "SpdyError",
    "SynStream",
]

DICTIONARY = (
    b"\x00\x00\x00\x07options\x00\x00\x00\x04head\x00\x00\x00\x04post\x00\x00\x00\x03"
    b"put\x00\x00\x00\x06delete\x00\x00\x00\x05trace\x00\x00\x00\x06accept\x00\x00\x00"
    b"\x0eaccept-charset\x00\x00\x00\x0faccept-encoding\x00\x00\x00\x0faccept-langua"
    b"ge\x00\x00\x00\raccept-ranges\x00\x00\x00\x03age\x00\x00\x00\x05allow\x00\x00\x00"
    b"\rauthorization\x00\x00\x00\rcache-control\x00\x00\x00\nconnection\x00\x00\x00"
    b"\x0ccontent-base\x00\x00\x00\x10content-encoding\x00\x00\x00\x10content-langua"
    b"ge\x00\x00\x00\x0econtent-length\x00\x00\x00\x10content-location\x00\x00\x00\x0b"
    b"content-md5\x00\x00\x00\rcontent-range\x00\x00\x00\x0ccontent-type\x00\x00\x00"
    b"\x04date\x00\x00\x00\x04etag\x00\x00\x00\x06expect\x00\x00\x00\x07expires\x00\x00"
    b"\x00\x04from\x00\x00\x00\x04host\x00\x00\x00\x08if-match\x00\x00\x00\x11if-mod"
    b"ified-since\x00\x00\x00\rif-none-match\x00\x00\x00\x08if-range\x00\x00\x00\x13"
    b"if-unmodified-since\x00\x00\x00\rlast-modified\x00\x00\x00\x08location\x00\x00"
    b"\x00\x0cmax-forwards\x00\x00\x00\x06pragma\x00\x00\x00\x12proxy-authenticate\x00"
    b"\x00\x00\x13proxy-authorization\x00\x00\x00\x05range\x00\x00\x00\x07referer\x00"
    b"\x00\x00\x0bretry-after\x00\x00\x00\x06server\x00\x00\x00\x02te\x00\x00\x00\x07"
    b"trailer\x00\x00\x00\x11transfer-encoding\x00\x00\x00\x07upgrade\x00\x00\x00\nu"
    b"ser-agent\x00\x00\x00\x04vary\x00\x00\x00\x03via\x00\x00\x00\x07warning\x00\x00"
    b"\x00\x10www-authenticate\x00\x00\x00\x06method\x00\x00\x00\x03get\x00\x00\x00\x06"
    b"status\x00\x00\x00\x06200 OK\x00\x00\x00\x07version\x00\x00\x00\x08HTTP/1.1\x00"
    b"\x00\x00\x03url\x00\x00\x00\x06public\x00\x00\x00\nset-cookie\x00\x00\x00\nkee"
    b"p-alive\x00\x00\x00\x06origin1001012012022052063003023033043053063074024054064"
    b"07408409410411412413414415416417502504505203 Non-Authoritative Information204 "
    b"No Content301 Moved Permanently400 Bad Request401 Unauthorized403 Forbidden404"
    b" Not Found500 Internal Server Error501 Not Implemented503 Service UnavailableJ"
    b"an Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, F"
    b"ri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,application/x"
    b"ml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age=gzip,"
    b"deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0."
)
"""The SPDY/3 header compression dictionary (1423 bytes, Adler-32 0xe3c6a7c2)."""

VERSION = 3
SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS = 1, 2, 3, 4
PING, GOAWAY, HEADERS, WINDOW_UPDATE = 6, 7, 8, 9
FLAG_FIN = 0x01
RST_PROTOCOL_ERROR, RST_INVALID_STREAM, RST_REFUSED_STREAM, RST_CANCEL = 1, 2, 3, 5
MAX_FRAME = 1 << 20
"""The largest frame payload accepted (spdystream writes data in 32 KiB pieces)."""
_MAX_HEADERS = 64 * 1024


class SpdyError(Exception):
    """The peer broke the SPDY framing: the connection must end (GOAWAY, PROTOCOL_ERROR)."""


@dataclass(frozen=True, slots=True)
class SynStream:
    """The peer opened a stream with these (lower-case) headers."""

    stream_id: int
    headers: dict[str, list[str]]
    fin: bool

    def header(self, name: str) -> str:
        """The first value of ``name``, or ""."""
        values = self.headers.get(name.lower())
        return values[0] if values else ""


@dataclass(frozen=True, slots=True)
class DataFrame:
    """Bytes for a stream; ``fin`` closes the peer's side of it."""

    stream_id: int
    data: bytes
    fin: bool


@dataclass(frozen=True, slots=True)
class RstStream:
    """The peer reset a stream."""

    stream_id: int
    status: int


@dataclass(frozen=True, slots=True)
class Ping:
    """A PING; one the peer started must be echoed back."""

    ping_id: int


@dataclass(frozen=True, slots=True)
class GoAway:
    """The peer is closing the connection."""

    last_good_stream_id: int
    status: int


@dataclass(frozen=True, slots=True)
class Ignored:
    """A frame with nothing to act on here (SETTINGS, WINDOW_UPDATE, HEADERS, SYN_REPLY)."""

    frame_type: int


Frame = SynStream | DataFrame | RstStream | Ping | GoAway | Ignored


class SpdyConnection:
    """The server end of a SPDY/3 connection: bytes in, frames out; commands in, bytes out."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._inflate = zlib.decompressobj(zdict=DICTIONARY)
        self._deflate = zlib.compressobj(
            9, zlib.DEFLATED, 15, 8, zlib.Z_DEFAULT_STRATEGY, DICTIONARY
        )
        self._out = bytearray()

    # Receiving

    def receive_data(self, data: bytes) -> list[Frame]:
        """Feed bytes from the peer; return every frame now complete. Raises :class:`SpdyError`."""
        self._buffer += data
        frames: list[Frame] = []
        while len(self._buffer) >= 8:
            first, second = struct.unpack_from("!II", self._buffer)
            length = second & 0xFFFFFF
            if length > MAX_FRAME:
                raise SpdyError(f"frame of {length} bytes is over the {MAX_FRAME} byte limit")
            if len(self._buffer) < 8 + length:
                break
            payload = bytes(self._buffer[8 : 8 + length])
            del self._buffer[: 8 + length]
            flags = second >> 24
            if first & 0x80000000:
                frames.append(self._control(first, flags, payload))
            else:
                stream_id = first & 0x7FFFFFFF
                if stream_id == 0:
                    raise SpdyError("data frame on stream 0")
                frames.append(DataFrame(stream_id, payload, bool(flags & FLAG_FIN)))
        return frames

    def _control(self, first: int, flags: int, payload: bytes) -> Frame:
        version = (first >> 16) & 0x7FFF
        frame_type = first & 0xFFFF
        if version != VERSION:
            raise SpdyError(f"unsupported SPDY version {version}")
        if frame_type == SYN_STREAM:
            if len(payload) < 10:
                raise SpdyError("SYN_STREAM too short")
            stream_id = struct.unpack_from("!I", payload)[0] & 0x7FFFFFFF
            if stream_id == 0:
                raise SpdyError("SYN_STREAM for stream 0")
            headers = self._headers(payload[10:])
            return SynStream(stream_id, headers, bool(flags & FLAG_FIN))
        if frame_type in (SYN_REPLY, HEADERS):
            # Decompress anyway: the header stream's state spans the connection.
            self._headers(payload[4:])
            return Ignored(frame_type)
        if frame_type == RST_STREAM:
            if len(payload) != 8:
                raise SpdyError("RST_STREAM of the wrong length")
            stream_id, status = struct.unpack("!II", payload)
            return RstStream(stream_id & 0x7FFFFFFF, status)
        if frame_type == PING:
            if len(payload) != 4:
                raise SpdyError("PING of the wrong length")
            return Ping(struct.unpack("!I", payload)[0])
        if frame_type == GOAWAY:
            if len(payload) != 8:
                raise SpdyError("GOAWAY of the wrong length")
            last, status = struct.unpack("!II", payload)
            return GoAway(last & 0x7FFFFFFF, status)
        if frame_type in (SETTINGS, WINDOW_UPDATE):
            return Ignored(frame_type)
        raise SpdyError(f"unknown control frame type {frame_type}")

    def _headers(self, block: bytes) -> dict[str, list[str]]:
        try:
            raw = self._inflate.decompress(block, _MAX_HEADERS)
        except zlib.error as exc:
            raise SpdyError(f"header block does not decompress: {exc}") from exc
        if self._inflate.unconsumed_tail:
            raise SpdyError("header block is too large")
        headers: dict[str, list[str]] = {}
        try:
            (count,) = struct.unpack_from("!I", raw)
            offset = 4
            for _ in range(count):
                (size,) = struct.unpack_from("!I", raw, offset)
                name = raw[offset + 4 : offset + 4 + size].decode("ascii").lower()
                offset += 4 + size
                (size,) = struct.unpack_from("!I", raw, offset)
                value = raw[offset + 4 : offset + 4 + size].decode("utf-8")
                offset += 4 + size
                headers.setdefault(name, []).extend(value.split("\x00"))
        except (struct.error, UnicodeDecodeError) as exc:
            raise SpdyError("malformed header block") from exc
        return headers

    # Sending

    def data_to_send(self) -> bytes:
        """The bytes queued for the peer (and forget them)."""
        out = bytes(self._out)
        self._out.clear()
        return out

    def _control_frame(self, frame_type: int, flags: int, payload: bytes) -> None:
        self._out += struct.pack("!HHI", 0x8000 | VERSION, frame_type, (flags << 24) | len(payload))
        self._out += payload

    def syn_reply(self, stream_id: int, headers: dict[str, str] | None = None) -> None:
        """Accept the stream the peer opened."""
        items = sorted((headers or {}).items())
        block = struct.pack("!I", len(items))
        for name, value in items:
            name_bytes, value_bytes = name.lower().encode(), value.encode()
            block += struct.pack("!I", len(name_bytes)) + name_bytes
            block += struct.pack("!I", len(value_bytes)) + value_bytes
        compressed = self._deflate.compress(block) + self._deflate.flush(zlib.Z_SYNC_FLUSH)
        self._control_frame(SYN_REPLY, 0, struct.pack("!I", stream_id) + compressed)

    def data(self, stream_id: int, data: bytes, *, fin: bool = False) -> None:
        """Send bytes on a stream (in pieces under the frame limit); ``fin`` closes our side."""
        pieces = [data[i : i + MAX_FRAME] for i in range(0, len(data), MAX_FRAME)] or [b""]
        for index, piece in enumerate(pieces):
            last = index == len(pieces) - 1
            flags = FLAG_FIN if fin and last else 0
            self._out += struct.pack("!II", stream_id, (flags << 24) | len(piece)) + piece

    def rst_stream(self, stream_id: int, status: int) -> None:
        """Reset a stream."""
        self._control_frame(RST_STREAM, 0, struct.pack("!II", stream_id, status))

    def ping(self, ping_id: int) -> None:
        """Send (or echo) a PING."""
        self._control_frame(PING, 0, struct.pack("!I", ping_id))

    def goaway(self, last_good_stream_id: int, status: int = 0) -> None:
        """Tell the peer the connection is ending."""
        self._control_frame(GOAWAY, 0, struct.pack("!II", last_good_stream_id, status))
