"""JSON records on a stream: one JSON object per line (docs/protocol.md, "Command streams").

Sans-I/O: :func:`encode_record` gives the bytes of one record,
:class:`RecordReader` takes stream bytes as they come and returns the whole
records they complete. Lines are bounded; anything but a JSON object per
line is a :class:`MalformedFrameError`.
"""

from __future__ import annotations

import json
from typing import Any

from .errors import MalformedFrameError

__all__ = ["MAX_RECORD", "RecordReader", "encode_record"]

#: The longest record, in bytes.
MAX_RECORD = 2 * 1024 * 1024


def encode_record(record: dict[str, Any]) -> bytes:
    """One record as a line of JSON."""
    data = json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
    if len(data) > MAX_RECORD:
        raise ValueError(f"record of {len(data)} bytes exceeds {MAX_RECORD}")
    return data


class RecordReader:
    """Splits stream bytes into records."""

    def __init__(self, limit: int = MAX_RECORD) -> None:
        self._buffer = bytearray()
        self._limit = limit
        #: How much of the buffer is known to hold no newline.
        self._scanned = 0

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buffer += data
        records = []
        # Only what came since the last look is searched: a record sent a byte
        # at a time must not be scanned from its start each time.
        while (end := self._buffer.find(b"\n", self._scanned)) >= 0:
            line = bytes(self._buffer[:end])
            del self._buffer[: end + 1]
            self._scanned = 0
            records.append(self._decode(line))
        self._scanned = len(self._buffer)
        if len(self._buffer) > self._limit:
            raise MalformedFrameError(f"a record is longer than {self._limit} bytes")
        return records

    @property
    def buffered(self) -> int:
        """Bytes of an unfinished record held, waiting for its end."""
        return len(self._buffer)

    @property
    def pending(self) -> bool:
        """Bytes of an unfinished record are waiting."""
        return bool(self._buffer)

    def _decode(self, line: bytes) -> dict[str, Any]:
        if len(line) > self._limit:
            raise MalformedFrameError(f"a record is longer than {self._limit} bytes")
        try:
            value = json.loads(line)
        except (ValueError, UnicodeDecodeError) as exc:
            raise MalformedFrameError(f"a record is not valid JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise MalformedFrameError("a record must be a JSON object")
        return value
