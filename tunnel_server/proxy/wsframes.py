"""Where WebSocket frames end in what the server relays to a caller, and a close frame.

After a 101 the server relays an upgraded connection byte for byte without
parsing it. When the cluster's side breaks (access revoked, the agent gone)
a WebSocket caller is better told why, in a close frame, than cut off: kubectl
then prints ``websocket: close 1008 (policy violation): access revoked: ...``
rather than ``close 1006 (abnormal closure): unexpected EOF``. A close frame
may only follow a whole frame, so :class:`FrameBoundary` reads the headers of
the frames going by (RFC 6455, section 5.2), and skips their payloads.
"""

from __future__ import annotations

__all__ = ["CLOSE_GOING_AWAY", "CLOSE_POLICY", "FrameBoundary", "close_frame"]

#: Close codes (RFC 6455, section 7.4.1): the endpoint is going away, and the
#: message violates a policy (what kubectl shows for access taken away).
CLOSE_GOING_AWAY = 1001
CLOSE_POLICY = 1008
#: A close frame's payload: a two-byte code and at most 123 bytes of reason.
_MAX_REASON = 123


class FrameBoundary:
    """Follows the frames of one direction of a WebSocket connection."""

    __slots__ = ("_header", "_remaining")

    def __init__(self) -> None:
        self._header = bytearray()
        #: Payload bytes of the current frame still to come.
        self._remaining = 0

    @property
    def at_boundary(self) -> bool:
        """What went by so far ends with a whole frame (or nothing went by)."""
        return self._remaining == 0 and not self._header

    def feed(self, data: bytes) -> None:
        position, end = 0, len(data)
        while position < end:
            if self._remaining:
                step = min(self._remaining, end - position)
                self._remaining -= step
                position += step
                continue
            size = _header_size(self._header)
            taken = data[position : position + size - len(self._header)]
            self._header += taken
            position += len(taken)
            if len(self._header) == _header_size(self._header):
                self._remaining = _payload_length(self._header)
                self._header.clear()


def close_frame(code: int, reason: str) -> bytes:
    """An unmasked close frame (the server's side), its reason cut to fit on a character."""
    text = reason.encode()[:_MAX_REASON].decode("utf-8", "ignore").encode()
    payload = code.to_bytes(2, "big") + text
    return bytes((0x88, len(payload))) + payload


def _header_size(header: bytearray) -> int:
    """The header's length, as far as its first bytes tell (at least 2)."""
    if len(header) < 2:
        return 2
    length = header[1] & 0x7F
    extended = 2 if length == 126 else 8 if length == 127 else 0
    mask = 4 if header[1] & 0x80 else 0
    return 2 + extended + mask


def _payload_length(header: bytearray) -> int:
    length = header[1] & 0x7F
    if length == 126:
        return int.from_bytes(header[2:4], "big")
    if length == 127:
        return int.from_bytes(header[2:10], "big")
    return length
