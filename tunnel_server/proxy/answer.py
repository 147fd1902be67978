"""The agent's answer to a plain request, as the front door passes it on.

:func:`read_response_head` reads the answer's head from the stream (and the
body bytes that came with it), refusing with 502 what the agent may not send;
:func:`answer_framing` says which of its headers go to the caller and how its
body is framed: by its Content-Length, or chunked to the end of the stream.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from protocol.errors import MalformedFrameError
from protocol.http import (
    HOP_BY_HOP,
    ResponseHead,
    ResponseHeadParser,
    parse_content_length,
    reason_phrase,
)
from tunnel_kube import is_plain_path
from tunnel_mux import MuxStream, SessionError
from tunnel_server.proxy.exchange import ProxyExchange
from tunnel_server.proxy.refusal import ProxyRefusal, dropped_refusal

__all__ = [
    "DROPPED_RESPONSE_HEADERS",
    "AnswerFraming",
    "answer_framing",
    "answer_headers",
    "read_response_head",
]

#: Headers of the agent's answer never passed to the caller: hop-by-hop ones, and
#: cookies (the API server sets none; an agent's would be this server's).
DROPPED_RESPONSE_HEADERS = (HOP_BY_HOP - {"upgrade"}) | {"set-cookie"}


def answer_headers(headers: Iterable[tuple[str, str]], cluster: str) -> list[tuple[str, str]]:
    """The agent's answer headers as the caller gets them.

    :data:`DROPPED_RESPONSE_HEADERS` are dropped. A ``Location`` is the
    cluster's own: a plain path on the API server is put under
    ``/k8s/clusters/<cluster>``, where the caller reached it, and any other
    (another host, ``//host``, an encoded or dotted path) is dropped. A client
    follows a redirect with its token to the same host, so an agent's
    ``Location`` could otherwise send it to another cluster, or to this
    server's own API.
    """
    kept = []
    for name, value in headers:
        if name in DROPPED_RESPONSE_HEADERS:
            continue
        if name == "location":
            path = value.split("?", 1)[0]
            if path.startswith("/") and not path.startswith("//") and is_plain_path(path):
                kept.append((name, f"/k8s/clusters/{cluster}{value}"))
            continue
        kept.append((name, value))
    return kept


@dataclass(slots=True, init=False)
class AnswerFraming:
    """How an answer's body goes to the caller."""

    headers: list[tuple[str, str]]
    #: Bytes of body to pass on as they are; None: chunked, to the end of the stream.
    length: int | None
    #: The reason phrase for the caller's status line (the agent's, if it is safe).
    reason: str

    def __init__(self, headers: list[tuple[str, str]], length: int | None, reason: str) -> None:
        self.headers = headers
        self.length = length
        self.reason = reason


def answer_framing(method: str, response: ResponseHead, cluster: str) -> AnswerFraming:
    """The caller's headers, body framing and reason phrase for the agent's answer, or 502.

    The one check of an agent's answer head, whichever front end relays it:
    one valid ``Content-Length`` at most, never with ``Transfer-Encoding``
    (RFC 9112, 6.3: a message with both is an attack on its framing), and a
    reason phrase safe in a status line.
    """
    headers = answer_headers(response.headers, cluster)
    length: int | None = None
    for name, value in headers:
        if name == "content-length":
            parsed = parse_content_length(value)
            if parsed is None or (length is not None and parsed != length):
                raise ProxyRefusal(502, "BadGateway", "the agent's answer has an invalid length")
            length = parsed
    if length is not None:
        # Transfer-Encoding is hop-by-hop, so answer_headers dropped it: look in the head.
        for name, _ in response.headers:
            if name == "transfer-encoding":
                raise ProxyRefusal(
                    502,
                    "BadGateway",
                    "the agent's answer has both Transfer-Encoding and Content-Length",
                )
    reason = reason_phrase(response.status, response.reason)
    if method == "HEAD" or response.status in (204, 304):
        return AnswerFraming(headers, 0, reason)
    if length is None:
        headers.append(("transfer-encoding", "chunked"))
    return AnswerFraming(headers, length, reason)


async def read_response_head(
    stream: MuxStream, exchange: ProxyExchange, *, upgrade: bool = False
) -> tuple[ResponseHead, bytes]:
    """The agent's response head, and the body bytes that came with it.

    An interim (1xx) answer is refused, but for a 101 to an ``upgrade``.
    """
    parser = ResponseHeadParser()
    while True:
        try:
            data = await stream.read()
        except SessionError as exc:
            raise dropped_refusal(exc, exchange.cluster) from exc
        if not data:
            raise ProxyRefusal(502, "BadGateway", "the agent ended the stream without answering")
        try:
            early = parser.feed(data)
        except MalformedFrameError as exc:
            raise ProxyRefusal(502, "BadGateway", f"the agent's answer is invalid: {exc}") from exc
        if parser.head is not None:
            status = parser.head.status
            if status < 200 and not (upgrade and status == 101):
                # Relayed, an interim answer would be followed by the agent's bytes as they are.
                raise ProxyRefusal(
                    502, "BadGateway", f"the agent answered {status}, which was not asked for"
                )
            exchange.status = parser.head.status
            return parser.head, early
