"""HTTP/1.1 as the lean front end speaks it to callers: request heads in, response heads out.

Sans-I/O: :func:`parse_request_head` takes the bytes of one head (without the
blank line that ends it) and returns a :class:`CallerRequest` or raises
:class:`MalformedRequestError`; :func:`response_head` encodes an answer's head.
Checks are strict (RFC 9112): one space between the parts of the request line,
token header names, no control characters in values, no obsolete line folding,
Content-Length values that agree (one is kept) and never together with
Transfer-Encoding: what request smuggling and header injection rely on. Header
values must be UTF-8 (aiohttp reads them so too). Parsing takes linear time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from protocol.http import parse_content_length, reason_phrase
from tunnel_server.errors import ServerError

__all__ = [
    "CACHED_BLOCK",
    "LAST_CHUNK",
    "MAX_HEAD",
    "MAX_HEADER_LINES",
    "MAX_TARGET",
    "CallerRequest",
    "HeaderBlockCache",
    "MalformedRequestError",
    "chunk",
    "parse_request_head",
    "response_head",
]

#: Bounds of a caller's request head: its size and its number of header lines.
MAX_HEAD = 64 * 1024
MAX_HEADER_LINES = 128
#: The end of a chunked body.
LAST_CHUNK = b"0\r\n\r\n"
#: The largest header block a connection remembers (see HeaderBlockCache).
CACHED_BLOCK = 8 * 1024

#: The longest request target taken (Go's and nginx's default buffers hold about as much).
MAX_TARGET = 8192
_REQUEST_LINE = re.compile(rf"([A-Z]{{1,16}}) ([\x21-\x7e]{{1,{MAX_TARGET}}}) HTTP/1\.([01])")
# The name, then the rest: the value is trimmed and checked apart, in linear
# time (one pattern with optional white space around a lazy value backtracks
# quadratically on a long run of spaces).
_HEADER_LINE = re.compile(r"([!#$%&'*+\-.^_`|~0-9A-Za-z]{1,256}):(.*)")
_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]*")


class MalformedRequestError(ServerError):
    """The caller's request head is malformed: answer ``status`` and close."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass(slots=True, init=False)
class CallerRequest:
    """A parsed request head. Header names are in lower case, in order.

    ``headers`` is the same tuple object for every request whose header lines
    the connection's :class:`HeaderBlockCache` found unchanged, so a caller of
    the parse may remember what it decided for it by identity.
    """

    method: str
    target: str
    minor_version: int
    headers: tuple[tuple[str, str], ...]
    content_length: int | None
    #: Transfer-Encoding was sent (the front end leaves such bodies to aiohttp).
    chunked: bool
    keep_alive: bool
    #: The protocol an upgrade request asks for (Connection: upgrade + Upgrade).
    upgrade: str | None
    #: An Expect header was sent.
    expect: bool

    def __init__(
        self,
        method: str,
        target: str,
        minor_version: int,
        headers: tuple[tuple[str, str], ...],
        content_length: int | None,
        chunked: bool,
        keep_alive: bool,
        upgrade: str | None,
        expect: bool,
    ) -> None:
        self.method = method
        self.target = target
        self.minor_version = minor_version
        self.headers = headers
        self.content_length = content_length
        self.chunked = chunked
        self.keep_alive = keep_alive
        self.upgrade = upgrade
        self.expect = expect

    def header(self, name: str) -> str | None:
        """The first value of the header ``name`` (in lower case), or None."""
        for key, value in self.headers:
            if key == name:
                return value
        return None


class HeaderBlockCache:
    """The last header block one connection sent, and what it parsed to.

    kubectl and client-go send the same header lines with every request on a
    connection; only the request line changes. The cache is keyed on the
    block's exact bytes, so a hit is the parse those bytes always give: it
    saves the work, not a check. Only blocks of up to :data:`CACHED_BLOCK`
    bytes are kept (kubectl's are a few hundred), so an idle connection holds
    little, whoever opened it.
    """

    __slots__ = ("_block", "_raw")

    def __init__(self) -> None:
        self._raw: bytes | None = None
        self._block: _HeaderBlock | None = None

    def holds(self, headers: tuple[tuple[str, str], ...]) -> bool:
        """True if ``headers`` are the remembered block's (the next repeat gives them again)."""
        return self._block is not None and self._block.headers is headers


@dataclass(frozen=True, slots=True, init=False)
class _HeaderBlock:
    """What a request's header lines say, apart from its request line."""

    headers: tuple[tuple[str, str], ...]
    content_length: int | None
    chunked: bool
    #: The Connection header's tokens, in lower case.
    tokens: frozenset[str]
    upgrade: str | None
    expect: bool
    has_host: bool

    def __init__(
        self,
        headers: tuple[tuple[str, str], ...],
        content_length: int | None,
        chunked: bool,
        tokens: frozenset[str],
        upgrade: str | None,
        expect: bool,
        has_host: bool,
    ) -> None:
        object.__setattr__(self, "headers", headers)
        object.__setattr__(self, "content_length", content_length)
        object.__setattr__(self, "chunked", chunked)
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "upgrade", upgrade)
        object.__setattr__(self, "expect", expect)
        object.__setattr__(self, "has_host", has_host)


def parse_request_head(
    head: bytes | bytearray | memoryview, cache: HeaderBlockCache | None = None
) -> CallerRequest:
    """Parse one request head, given without its final empty line.

    With ``cache`` (one per connection), header lines equal to the previous
    request's are not parsed again.
    """
    if len(head) > MAX_HEAD:
        raise MalformedRequestError("the request head is too large", status=431)
    data = bytes(head)
    if data.count(b"\r\n") > MAX_HEADER_LINES:
        raise MalformedRequestError(f"more than {MAX_HEADER_LINES} header lines", status=431)
    line_end = data.find(b"\r\n")
    if line_end < 0:
        line_end = len(data)
    line = data[:line_end].decode("latin-1")
    match = _REQUEST_LINE.fullmatch(line)
    if match is None:
        parts = line.split(" ")
        if len(parts) == 3 and len(parts[1]) > MAX_TARGET:
            raise MalformedRequestError(
                f"the request target is longer than {MAX_TARGET} characters", status=414
            )
        raise MalformedRequestError("malformed request line")
    method, target, minor = match.groups()
    raw = data[line_end:]
    if cache is not None and cache._raw == raw and cache._block is not None:
        block = cache._block
    else:
        block = _parse_header_block(raw)
        if cache is not None:
            cache._raw, cache._block = (raw, block) if len(raw) <= CACHED_BLOCK else (None, None)
    if minor == "1" and not block.has_host:
        raise MalformedRequestError("an HTTP/1.1 request needs a Host header (RFC 9112, 3.2)")
    tokens = block.tokens
    # close always wins (RFC 9112, 9.3); HTTP/1.0 keeps alive only when asked.
    keep_alive = "close" not in tokens and (minor == "1" or "keep-alive" in tokens)
    return CallerRequest(
        method=method,
        target=target,
        minor_version=int(minor),
        headers=block.headers,
        content_length=block.content_length,
        chunked=block.chunked,
        keep_alive=keep_alive,
        upgrade=block.upgrade if block.upgrade and "upgrade" in tokens else None,
        expect=block.expect,
    )


def _parse_header_block(raw: bytes) -> _HeaderBlock:
    """The header lines after the request line (``raw`` starts with its CRLF, or is empty)."""
    headers: list[tuple[str, str]] = []
    content_length: int | None = None
    chunked = False
    connection = ""
    upgrade: str | None = None
    expect = False
    has_host = False
    for line in raw.decode("latin-1").split("\r\n")[1:]:
        field = _HEADER_LINE.fullmatch(line)
        if field is None:
            raise MalformedRequestError("malformed header line")
        name = field.group(1).lower()
        value = field.group(2).strip(" \t")
        if _VALUE.fullmatch(value) is None:
            raise MalformedRequestError(f"control character in the value of header {name}")
        if not value.isascii():
            try:
                value = value.encode("latin-1").decode("utf-8")
            except UnicodeDecodeError:
                raise MalformedRequestError(f"the value of header {name} is not UTF-8") from None
        if name == "content-length":
            length = parse_content_length(value)
            if length is None:
                raise MalformedRequestError("Content-Length must be a decimal number")
            if content_length is not None:
                if content_length != length:
                    raise MalformedRequestError("conflicting Content-Length headers")
                continue  # the same again: forwarded once
            content_length = length
        elif name == "transfer-encoding":
            chunked = True
        elif name == "connection":
            connection = f"{connection},{value.lower()}" if connection else value.lower()
        elif name == "upgrade":
            upgrade = value
        elif name == "expect":
            expect = True
        elif name == "host":
            if has_host:
                # Which one an intermediary used is anyone's guess (RFC 9112, 3.2).
                raise MalformedRequestError("more than one Host header")
            has_host = True
        headers.append((name, value))
    if chunked and content_length is not None:
        raise MalformedRequestError("Content-Length and Transfer-Encoding must not come together")
    tokens = (
        frozenset(token.strip() for token in connection.split(",")) if connection else frozenset()
    )
    return _HeaderBlock(tuple(headers), content_length, chunked, tokens, upgrade, expect, has_host)


def response_head(status: int, reason: str, headers: Iterable[tuple[str, str]]) -> bytes:
    """An HTTP/1.1 response head, blank line included.

    ``headers`` come from the agent, already validated (token names, no CR,
    LF or NUL in values: :mod:`protocol.http`); an unsafe reason is replaced.
    """
    parts = [f"HTTP/1.1 {status} {reason_phrase(status, reason)}"]
    parts.extend(f"{name}: {value}" for name, value in headers)
    parts.append("\r\n")
    return "\r\n".join(parts).encode("latin-1", "replace")


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked body."""
    return b"%x\r\n%b\r\n" % (len(data), data)
