"""The agent's answer to a plain request, as the front door passes it on.

:func:`read_response_head` reads the answer's head from the stream (and the
body bytes that came with it), refusing with 502 what the agent may not send;
:func:`answer_framing` says which of its headers go to the caller and how its
body is framed: by its Content-Length, or chunked to the end of the stream.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.errors import MalformedFrameError
from protocol.http import ResponseHead, ResponseHeadParser, parse_content_length
from tunnel_mux import MuxStream, SessionError
from tunnel_server.proxy.exchange import ProxyExchange
from tunnel_server.proxy.refusal import ProxyRefusal, dropped_refusal
from tunnel_server.proxy.request import answer_headers

__all__ = ["AnswerFraming", "answer_framing", "read_response_head"]


@dataclass(slots=True, init=False)
class AnswerFraming:
    """How an answer's body goes to the caller."""

    headers: list[tuple[str, str]]
    #: Bytes of body to pass on as they are; None: chunked, to the end of the stream.
    length: int | None

    def __init__(self, headers: list[tuple[str, str]], length: int | None) -> None:
        self.headers = headers
        self.length = length


def answer_framing(method: str, response: ResponseHead, cluster: str) -> AnswerFraming:
    """The caller's headers and body framing for the agent's answer to ``method``, or 502."""
    headers = answer_headers(response.headers, cluster)
    length: int | None = None
    for name, value in headers:
        if name == "content-length":
            parsed = parse_content_length(value)
            if parsed is None or (length is not None and parsed != length):
                raise ProxyRefusal(502, "BadGateway", "the agent's answer has an invalid length")
            length = parsed
    if method == "HEAD" or response.status in (204, 304):
        return AnswerFraming(headers, 0)
    if length is None:
        headers.append(("transfer-encoding", "chunked"))
    return AnswerFraming(headers, length)


async def read_response_head(
    stream: MuxStream, exchange: ProxyExchange
) -> tuple[ResponseHead, bytes]:
    """The agent's response head, and the body bytes that came with it."""
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
            if parser.head.status < 200:
                raise ProxyRefusal(502, "BadGateway", "the agent answered a plain request with 1xx")
            exchange.status = parser.head.status
            return parser.head, early
