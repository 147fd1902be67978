"""Records on a stream: JSON objects, one a line, bounded."""

from __future__ import annotations

from typing import Any

import pytest

from protocol.errors import MalformedFrameError
from protocol.records import RecordReader, encode_record

RECORDS: list[dict[str, Any]] = [
    {"event": "log", "lines": ["a", "b\nc"]},
    {"event": "heartbeat"},
    {"n": 3},
]


def test_records_come_out_as_they_went_in_whatever_the_cuts() -> None:
    data = b"".join(encode_record(record) for record in RECORDS)
    for piece in (1, 2, 7, len(data)):
        reader = RecordReader()
        got = []
        for offset in range(0, len(data), piece):
            got += reader.feed(data[offset : offset + piece])
        assert got == RECORDS, piece
        assert not reader.pending


def test_a_record_longer_than_the_limit_is_refused_before_its_end() -> None:
    reader = RecordReader(limit=1024)
    reader.feed(b'{"x": "' + b"y" * 1000)
    with pytest.raises(MalformedFrameError, match="a record is longer than 1024 bytes"):
        reader.feed(b"y" * 100)


@pytest.mark.parametrize("line", [b"[1, 2]", b"not json"])
def test_a_line_that_is_not_a_json_object_is_refused(line: bytes) -> None:
    with pytest.raises(MalformedFrameError, match="a record"):
        RecordReader().feed(line + b"\n")
