"""HTTP over a stream of kind ``http`` (docs/protocol.md, "HTTP streams").

The server opens the stream with the request head in the OPEN headers::

    {"method": "GET", "path": "/api/v1/pods?watch=1",
     "headers": [["accept", "application/json"], ...], "upgrade": false}

and then sends the request body as the stream's data (END when it is done).
The agent answers with a response head at the start of its data: a 4-byte
big-endian length, then a msgpack map ``{"status", "reason", "headers"}``; the
response body follows. After a 101 answer to an upgrade, the data in both
directions is the upgraded connection's bytes, unchanged.

Sans-I/O like the rest of the package: :class:`ResponseHeadParser` takes the
stream's bytes as they come and says when the head is complete.
"""

from __future__ import annotations

import functools
import re
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from .errors import MalformedFrameError

__all__ = [
    "CLIENT_ADDRESS",
    "HOP_BY_HOP",
    "MAX_HEADERS",
    "MAX_PATH_LENGTH",
    "MAX_RESPONSE_HEAD",
    "METHODS",
    "Headers",
    "RequestHead",
    "ResponseHead",
    "ResponseHeadParser",
    "encode_response_head",
    "parse_content_length",
    "reason_phrase",
]

#: Headers of one connection, never relayed to the next (RFC 9110, 7.6.1).
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)

#: What a client says of its own address (a proxy's word, when a proxy sets it):
#: never relayed to an API server, which writes X-Forwarded-For and X-Real-Ip into
#: its audit events' sourceIPs. Every ``x-forwarded-*`` header counts too.
CLIENT_ADDRESS = frozenset(
    {
        "forwarded",
        "forwarded-for",
        "x-forwarded",
        "x-real-ip",
        "x-client-ip",
        "client-ip",
        "true-client-ip",
        "x-cluster-client-ip",
        "x-original-forwarded-for",
        "x-originating-ip",
        "cf-connecting-ip",
        "fastly-client-ip",
        "x-envoy-external-address",
    }
)

#: Bounds of a relayed request or response head.
MAX_PATH_LENGTH = 8 * 1024
MAX_HEADERS = 128
MAX_HEADER_VALUE = 16 * 1024
MAX_RESPONSE_HEAD = 64 * 1024

#: The methods an ``http`` stream may carry (what Kubernetes clients send).
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_LENGTH = struct.Struct(">I")

Headers = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True, init=False)
class RequestHead:
    """A relayed request: method, path with query, headers (names lower-case)."""

    method: str
    path: str
    headers: Headers
    upgrade: bool

    def __init__(self, method: str, path: str, headers: Headers, upgrade: bool = False) -> None:
        object.__setattr__(self, "method", method)
        object.__setattr__(self, "path", path)
        object.__setattr__(self, "headers", headers)
        object.__setattr__(self, "upgrade", upgrade)

    def to_open_headers(self) -> dict[str, Any]:
        # The pairs go as they are: msgpack writes a tuple as an array.
        return {
            "method": self.method,
            "path": self.path,
            "headers": self.headers,
            "upgrade": self.upgrade,
        }

    @classmethod
    def from_open_headers(cls, value: dict[str, Any]) -> RequestHead:
        """Validate the OPEN header map of an ``http`` stream."""
        method = value.get("method")
        if not isinstance(method, str) or method not in METHODS:
            raise MalformedFrameError(f"unsupported HTTP method {str(method)[:16]!r}")
        path = value.get("path")
        if (
            not isinstance(path, str)
            or not path.startswith("/")
            or path.startswith("//")
            or len(path) > MAX_PATH_LENGTH
            or not path.isprintable()
            or " " in path
        ):
            raise MalformedFrameError("the request path must be an absolute path")
        upgrade = value.get("upgrade", False)
        if not isinstance(upgrade, bool):
            raise MalformedFrameError("upgrade must be a boolean")
        return cls(method, path, _request_headers(value.get("headers")), upgrade)

    def header(self, name: str) -> str | None:
        """The first value of a header (name in lower case)."""
        for key, value in self.headers:
            if key == name:
                return value
        return None


@dataclass(frozen=True, slots=True, init=False)
class ResponseHead:
    status: int
    reason: str
    headers: Headers

    def __init__(self, status: int, reason: str, headers: Headers) -> None:
        object.__setattr__(self, "status", status)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "headers", headers)

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None


def encode_response_head(status: int, reason: str, headers: Iterable[tuple[str, str]]) -> bytes:
    """The bytes that start the agent's answer on an ``http`` stream."""
    # msgpack writes pairs (tuples or lists) as arrays: a list or tuple of them goes as it is.
    pairs = headers if isinstance(headers, list | tuple) else list(headers)
    body: bytes = msgpack.packb({"status": status, "reason": reason[:128], "headers": pairs})
    if len(body) > MAX_RESPONSE_HEAD:
        raise ValueError(f"response head of {len(body)} bytes exceeds {MAX_RESPONSE_HEAD}")
    return _LENGTH.pack(len(body)) + body


class ResponseHeadParser:
    """Finds the response head at the start of an ``http`` stream's data."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self.head: ResponseHead | None = None

    def feed(self, data: bytes) -> bytes:
        """Take stream bytes; once the head is complete, return the body bytes after it.

        Returns b"" while the head is incomplete. Raises
        :class:`MalformedFrameError` for an invalid or oversized head.
        """
        if self.head is not None:
            return data
        # Usually the whole head (and often the whole body) comes in one
        # chunk: then it is read in place, without gathering it first.
        buffer: bytes | bytearray = data
        if self._buffer:
            self._buffer += data
            buffer = self._buffer
        if len(buffer) < _LENGTH.size:
            self._keep(buffer)
            return b""
        (length,) = _LENGTH.unpack_from(buffer)
        if length > MAX_RESPONSE_HEAD:
            raise MalformedFrameError(f"response head of {length} bytes is too large")
        end = _LENGTH.size + length
        if len(buffer) < end:
            self._keep(buffer)
            return b""
        try:
            value = msgpack.unpackb(memoryview(buffer)[_LENGTH.size : end], raw=False)
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise MalformedFrameError("the response head is not valid msgpack") from exc
        if not isinstance(value, dict):
            raise MalformedFrameError("the response head must be a map")
        status = value.get("status")
        reason = value.get("reason", "")
        if type(status) is not int or not 100 <= status <= 599 or not isinstance(reason, str):
            raise MalformedFrameError("the response head needs a status 100..599")
        self.head = ResponseHead(status, reason[:128], _headers(value.get("headers")))
        rest = bytes(buffer[end:]) if end < len(buffer) else b""
        self._buffer = bytearray()
        return rest

    def _keep(self, buffer: bytes | bytearray) -> None:
        """Hold an incomplete head until more comes."""
        if buffer is not self._buffer:
            self._buffer += buffer


def _request_headers(value: Any) -> Headers:
    """:func:`_headers` for a request head: a block seen lately is not checked again.

    Clients send the same header lines with every request of a connection,
    and the server adds the same identity to them. Only a list of lists (what
    msgpack decodes) is looked up: its pairs as tuples stand for it exactly,
    where a string or a map would pass for a pair of its letters or keys.
    """
    if type(value) is list and len(value) <= MAX_HEADERS and set(map(type, value)) <= _LISTS:
        try:
            return _known_headers(tuple(map(tuple, value)))
        except TypeError:
            pass  # a pair holding a list or a map: not a key; checked (and refused) below
    return _headers(value)


_LISTS = {list}


@functools.lru_cache(maxsize=64)
def _known_headers(pairs: tuple[tuple[Any, ...], ...]) -> Headers:
    # At most 64 blocks of at most the protocol's header limit each; only
    # valid ones are kept (a refusal raises, and is not remembered).
    return _headers(pairs)


def _headers(value: Any) -> Headers:
    # type(...) is list first: what msgpack decodes to, without the slower ABC check.
    if type(value) is not list and (
        not isinstance(value, Sequence) or isinstance(value, str | bytes)
    ):
        raise MalformedFrameError("headers must be a list of [name, value] pairs")
    if len(value) > MAX_HEADERS:
        raise MalformedFrameError(f"more than {MAX_HEADERS} headers")
    pairs = []
    names = []
    values = []
    for pair in value:
        if (
            (
                type(pair) is not list
                and (not isinstance(pair, Sequence) or isinstance(pair, str | bytes))
            )
            or len(pair) != 2
            or not isinstance(pair[0], str)
            or not isinstance(pair[1], str)
            or len(pair[1]) > MAX_HEADER_VALUE
        ):
            raise MalformedFrameError(_BAD_HEADER)
        name, text = pair
        names.append(name)
        values.append(text)
        pairs.append((name.lower(), text))
    # One check over all names and one over all values, in C: checked one by
    # one, they cost more than the rest. A space joins the names (no token
    # holds one, so the count of spaces tells a name that did); values are
    # unsafe together exactly when one of them is.
    if names:
        joined = " ".join(names)
        if _TOKENS.fullmatch(joined) is None or joined.count(" ") != len(names) - 1:
            raise MalformedFrameError(_BAD_HEADER)
        if _UNSAFE_VALUE.search("".join(values)) is not None:
            raise MalformedFrameError(_BAD_HEADER)
    return tuple(pairs)


_BAD_HEADER = "a header must be a [name, value] pair of safe strings"
# Names: RFC 9110 token characters, 1 to 256 of them, joined by single spaces. Values must
# not break a header line. (Regular expressions: checked in C, for every proxied request.)
_NAME_PATTERN = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,256}"
_TOKENS = re.compile(f"{_NAME_PATTERN}(?: {_NAME_PATTERN})*")
_UNSAFE_VALUE = re.compile(r"[\r\n\0]")


_DIGITS = re.compile(r"[0-9]{1,15}")


def parse_content_length(value: str) -> int | None:
    """A Content-Length value as a number, or None if it is not 1-15 ASCII digits."""
    return int(value) if _DIGITS.fullmatch(value) is not None else None


#: What a reason phrase may hold, written into a status line (RFC 9112, 4: no CR or LF).
_REASON = re.compile(r"[\t\x20-\x7e]{1,128}")
_REASONS = {
    200: "OK",
    201: "Created",
    202: "Accepted",
    204: "No Content",
    304: "Not Modified",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    409: "Conflict",
    422: "Unprocessable Entity",
    429: "Too Many Requests",
    414: "URI Too Long",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


def reason_phrase(status: int, reason: str) -> str:
    """``reason`` if it is safe in an HTTP/1.1 status line, else the status's usual phrase.

    An agent's reason phrase with a line break or a control character would
    split the status line (or make aiohttp refuse the whole answer); it is
    replaced, not relayed.
    """
    if reason and _REASON.fullmatch(reason) is not None:
        return reason
    return _REASONS.get(status, "Unknown")
