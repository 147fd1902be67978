"""HTTP-stream heads: the response head parser and header validation (docs/protocol.md)."""

from __future__ import annotations

import struct

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.errors import MalformedFrameError
from protocol.http import (
    MAX_RESPONSE_HEAD,
    RequestHead,
    ResponseHead,
    ResponseHeadParser,
    encode_response_head,
)

HEAD = encode_response_head(200, "OK", [("Content-Type", "application/json"), ("x-trace", "a b")])
EXPECTED = ResponseHead(200, "OK", (("content-type", "application/json"), ("x-trace", "a b")))


def test_a_head_and_body_in_one_chunk_give_the_head_and_the_body() -> None:
    parser = ResponseHeadParser()
    assert parser.feed(HEAD + b'{"kind":"Pod"}') == b'{"kind":"Pod"}'
    assert parser.head == EXPECTED
    assert parser.feed(b"more") == b"more"


@pytest.mark.parametrize("split", [1, 3, 4, 5, len(HEAD) - 1])
def test_a_head_split_anywhere_is_put_together(split: int) -> None:
    parser = ResponseHeadParser()
    assert parser.feed(HEAD[:split]) == b""
    assert parser.head is None
    assert parser.feed(HEAD[split:] + b"body") == b"body"
    assert parser.head == EXPECTED


def test_a_head_alone_gives_the_head_and_no_body_yet() -> None:
    parser = ResponseHeadParser()
    assert parser.feed(HEAD) == b""
    assert parser.head == EXPECTED
    assert parser.feed(b"body") == b"body"


def test_a_head_fed_byte_by_byte_is_put_together() -> None:
    parser = ResponseHeadParser()
    rest = [parser.feed(HEAD[i : i + 1]) for i in range(len(HEAD))]
    assert rest == [b""] * len(HEAD)
    assert parser.head == EXPECTED


def test_an_oversized_head_length_is_refused_before_it_arrives() -> None:
    parser = ResponseHeadParser()
    with pytest.raises(MalformedFrameError, match="too large"):
        parser.feed(struct.pack(">I", MAX_RESPONSE_HEAD + 1))


def head_of(value: object) -> bytes:
    body: bytes = msgpack.packb(value)
    return struct.pack(">I", len(body)) + body


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([1, 2], "must be a map"),
        ({"status": 99}, "status 100..599"),
        ({"status": "200"}, "status 100..599"),
        ({"status": 200, "headers": "x"}, "list of"),
        ({"status": 200, "headers": [["bad name", "v"]]}, "safe strings"),
        ({"status": 200, "headers": [["", "v"]]}, "safe strings"),
        ({"status": 200, "headers": [["x-a", "v\r\nx-injected: 1"]]}, "safe strings"),
        ({"status": 200, "headers": [["x-a", "v\0"]]}, "safe strings"),
        ({"status": 200, "headers": [["n" * 257, "v"]]}, "safe strings"),
        ({"status": 200, "headers": [["naïve", "v"]]}, "safe strings"),
        ({"status": 200, "headers": [["x-a"]]}, "safe strings"),
        ({"status": 200, "headers": ["ab"]}, "safe strings"),
    ],
)
def test_an_invalid_head_is_refused_with_a_reason(value: object, message: str) -> None:
    with pytest.raises(MalformedFrameError, match=message):
        ResponseHeadParser().feed(head_of(value))


def test_every_token_character_is_accepted_in_a_header_name() -> None:
    name = "!#$%&'*+-.^_`|~09azAZ"
    parser = ResponseHeadParser()
    parser.feed(head_of({"status": 204, "headers": [[name, "ok"]]}))
    assert parser.head == ResponseHead(204, "", ((name.lower(), "ok"),))


@pytest.mark.parametrize("method", [["GET"], {"GET": 1}, 7, None])
def test_a_request_head_whose_method_is_not_a_string_is_refused(method: object) -> None:
    with pytest.raises(MalformedFrameError, match="unsupported HTTP method"):
        RequestHead.from_open_headers({"method": method, "path": "/api", "headers": []})


def test_a_request_head_with_an_unsafe_header_is_refused() -> None:
    with pytest.raises(MalformedFrameError, match="safe strings"):
        RequestHead.from_open_headers(
            {"method": "GET", "path": "/api", "headers": [["x-a", "v\nx-b: 1"]]}
        )


@pytest.mark.parametrize(
    "impostor",
    [
        ["ab"],  # a string, not a pair: as letters it would be the pair ("a", "b")
        [{"a": "1", "b": "2"}],  # a map: its keys would be the pair
        [("a", "b")],  # a tuple is no msgpack value, but is a pair: checked in full
        [["a", ["b"]]],  # not hashable
    ],
)
def test_a_remembered_request_header_block_is_not_matched_by_what_only_resembles_it(
    impostor: list[object],
) -> None:
    known = RequestHead.from_open_headers({"method": "GET", "path": "/", "headers": [["a", "b"]]})
    assert known.headers == (("a", "b"),)

    head = {"method": "GET", "path": "/", "headers": impostor}
    if impostor == [("a", "b")]:
        assert RequestHead.from_open_headers(head).headers == (("a", "b"),)
    else:
        with pytest.raises(MalformedFrameError):
            RequestHead.from_open_headers(head)


_NAME_CHARS = "!#$%&'*+-.^_`|~09azAZ"


def _reference(pairs: list[list[str]]) -> tuple[tuple[str, str], ...] | None:
    """The header rule pair by pair, as plainly as it can be said (None: refused)."""
    checked = []
    for name, value in pairs:
        if not 1 <= len(name) <= 256 or any(c not in _ALL_NAME_CHARS for c in name):
            return None
        if any(c in "\r\n\0" for c in value):
            return None
        checked.append((name.lower(), value))
    return tuple(checked)


_ALL_NAME_CHARS = frozenset(
    "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
)


@given(
    st.lists(
        st.tuples(
            st.one_of(
                st.text(alphabet=_NAME_CHARS + " \t:é\r\n", max_size=6),
                st.integers(250, 260).map(lambda n: "n" * n),
            ),
            st.text(alphabet="ab \t\r\n\0é:", max_size=6),
        ),
        max_size=6,
    )
)
def test_headers_are_accepted_exactly_as_the_rule_says(pairs: list[tuple[str, str]]) -> None:
    value = [[name, text] for name, text in pairs]
    expected = _reference(value)
    open_headers = {"method": "GET", "path": "/api", "headers": value}
    for _ in range(2):  # the second time, a block accepted before is remembered
        if expected is None:
            with pytest.raises(MalformedFrameError, match="safe strings"):
                RequestHead.from_open_headers(open_headers)
        else:
            assert RequestHead.from_open_headers(open_headers).headers == expected
