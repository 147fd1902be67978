"""Serve ``http`` streams: relay Kubernetes API requests to the API server.

The request head comes in the OPEN headers, the body as stream data. The
agent checks its policy, replaces any credentials with its own, and sends the
request to the API server only (the path is appended to the API server's URL;
no other target is possible). The answer flows back as it comes: the head
(docs/protocol.md, "HTTP streams"), then the body chunk by chunk, so watches
and ``logs -f`` stream. After a 101 (exec, attach, port-forward) the bytes of
the upgraded connection are relayed unchanged both ways, half-close included.

Plain requests go through the agent's own HTTP/1.1 client
(:mod:`tunnel_agent.upstream`); upgrades and HEAD requests (whose answers
llhttp cannot tell have no body) go through aiohttp's client
(:mod:`tunnel_agent.kubeproxy_aiohttp`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import Counter

import aiohttp

from protocol.errors import ErrorCode, MalformedFrameError
from protocol.http import CLIENT_ADDRESS, HOP_BY_HOP, Headers, RequestHead, encode_response_head
from protocol.kinds import HTTP_ACCESS_REVOKED
from tunnel_kube import ApiRequest, error_answer, parse_api_request
from tunnel_mux import MuxStream, SessionError, StreamResetError

from .kubeapi import KubeApi
from .kubeproxy_aiohttp import DROPPED_RESPONSE_HEADERS, relay_request, relay_upgrade
from .policy import ProxyPolicy, Refusal
from .reviews import MAX_REVIEW, is_review, json_accepted, narrow_review, narrows
from .upstream import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamPool,
    UpstreamRequestError,
    UpstreamResponse,
    check_sendable,
)

__all__ = ["KubeProxy"]

logger = logging.getLogger(__name__)

# Headers the agent never passes to the API server: hop-by-hop ones,
# credentials (it sends its own), and claims of a client address, which the
# agent cannot vouch for (kube-apiserver writes X-Forwarded-For and X-Real-Ip
# into its audit events' sourceIPs). The server drops them too; the agent does
# not count on it.
_DROPPED_REQUEST = (
    HOP_BY_HOP
    | {
        "authorization",
        "proxy-authorization",
        "cookie",
        "host",
        # The server already answered the caller's Expect; the body streams as it comes.
        "expect",
    }
    | CLIENT_ADDRESS
)

#: Dropped whatever follows them. X-Remote-*: the API server's front-proxy identity
#: headers (--requestheader-*-headers' defaults); it reads them only from a client
#: certificate it trusts for that, never the agent's token, but they name an
#: identity and no request of a caller needs them (spelled with "_", the policy
#: refuses them). X-Forwarded-*: a client's address, host or scheme.
_DROPPED_PREFIXES = ("x-remote-", "x-forwarded-")


def _passes(name: str) -> bool:
    """Whether a caller's header goes on, read as a proxy that takes "_" for "-" would
    read it (so ``X_Real_Ip`` is dropped as ``X-Real-Ip`` is)."""
    folded = name.replace("_", "-")
    if folded in _DROPPED_REQUEST or folded.startswith(_DROPPED_PREFIXES):
        return False
    # Content_Length: a second length in disguise, which frames nothing here.
    return not (folded == "content-length" and folded != name)


@functools.lru_cache(maxsize=64)
def _forwarded(headers: Headers) -> Headers:
    """The caller's headers the agent passes on (remembered per block, as the policy's answer)."""
    return tuple((name, value) for name, value in headers if _passes(name))


def _body_refusal(head: RequestHead, stream: MuxStream) -> Refusal | None:
    """Why an upgrade or a HEAD request is refused: it says a body follows.

    Neither may carry one, and both go through aiohttp's client: a body
    shorter than its announced length would leave the API server taking the
    start of the next request on that connection as the rest of it, and what
    follows as a request that neither the server nor this agent checked.
    """
    announced = not head.upgrade and not stream.at_eof
    for name, value in head.headers:
        if name == "transfer-encoding" or (name == "content-length" and value.strip() != "0"):
            announced = True
    if not announced:
        return None
    what = "an upgrade request (exec, attach, port-forward)" if head.upgrade else "a HEAD request"
    return Refusal(400, "BadRequest", f"{what} cannot carry a body")


class KubeProxy:
    """Handles one ``http`` stream at a time per call; share one per agent."""

    def __init__(self, api: KubeApi, policy: ProxyPolicy) -> None:
        self.api = api
        self.policy = policy
        #: For metrics: requests by (verb, status), refusals by the policy.
        self.requests: Counter[tuple[str, int]] = Counter()
        self.refusals = 0
        self._pool: UpstreamPool | None = None

    async def close(self) -> None:
        """Close the connections to the API server kept for plain requests."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()

    async def handle(self, stream: MuxStream) -> None:
        # No await in an except block here: mypyc compiles this module (setup.py).
        try:
            await self._handle(stream)
        except (asyncio.CancelledError, SessionError):
            # A reset by the server cancels the handler (a request waiting on the
            # API server) or fails its next write; the stream says which reset.
            error = stream.error
            if (
                isinstance(error, StreamResetError)
                and error.remote
                and error.code == HTTP_ACCESS_REVOKED
            ):
                # The cluster's owner sees who lost access mid-request (a watch, an exec).
                logger.info(
                    "the server ended %s %s: %s",
                    stream.headers.get("method"),
                    str(stream.headers.get("path"))[:200],
                    error.reason,
                )
            raise

    async def _handle(self, stream: MuxStream) -> None:
        head = self._admit(stream)
        if isinstance(head, Refusal):
            await _answer_status(stream, head)
            return
        authorization = await self.api.authorization()
        if not head.upgrade and head.method != "HEAD":
            review = self._review(head)
            forwarded = _forwarded(head.headers)
            if review is not None:
                forwarded = json_accepted(forwarded)
            await self._request(stream, head, forwarded, authorization, review)
            return
        refusal = _body_refusal(head, stream)
        if refusal is not None:
            logger.info("refused %s %s: %s", head.method, head.path[:200], refusal.message)
            await _answer_status(stream, refusal)
            return
        # Neither carries a body (above): no length goes with them.
        headers = [pair for pair in _forwarded(head.headers) if pair[0] != "content-length"]
        if authorization:
            headers.append(("authorization", authorization))
        if head.upgrade:
            headers.append(("connection", "Upgrade"))
            upgrade = next((v for n, v in head.headers if n == "upgrade"), "")
            headers.append(("upgrade", upgrade))
        refusal = await self._through_aiohttp(stream, head, headers)
        if refusal is not None:
            await _answer_status(stream, refusal)

    def _review(self, head: RequestHead) -> ApiRequest | None:
        """The access or rules review whose answer the policy narrows (``kubectl auth can-i``)."""
        if head.method != "POST" or "selfsubject" not in head.path or not narrows(self.policy):
            return None
        request = parse_api_request(head.method, head.path)
        return request if is_review(request) else None

    def _admit(self, stream: MuxStream) -> RequestHead | Refusal:
        """The stream's request head, or why it is refused."""
        try:
            head = RequestHead.from_open_headers(stream.headers)
        except MalformedFrameError as exc:
            return Refusal(400, "BadRequest", f"invalid request: {exc}")
        checked = self.policy.check(head)
        if isinstance(checked, RequestHead):
            return checked
        refusal = checked
        self.refusals += 1
        logger.info("refused %s %s: %s", head.method, head.path[:200], refusal.message)
        return refusal

    async def _through_aiohttp(
        self, stream: MuxStream, head: RequestHead, headers: list[tuple[str, str]]
    ) -> Refusal | None:
        """Relay an upgrade or a HEAD request; a refusal if it cannot be, or the API server
        is out of reach."""
        try:
            check_sendable(headers)
        except UpstreamRequestError as exc:
            logger.info("cannot relay %s %s: %s", head.method, head.path[:200], exc)
            return Refusal(400, "BadRequest", f"the agent cannot relay this: {exc}")
        try:
            if head.upgrade:
                await relay_upgrade(self.api, self.requests, stream, head, headers)
            else:
                await relay_request(self.api, self.requests, stream, head, headers)
        except (aiohttp.ClientError, OSError) as exc:
            logger.warning("cannot reach the API server: %s", exc)
            return Refusal(502, "BadGateway", f"the agent cannot reach the API server: {exc}")
        return None

    async def _request(
        self,
        stream: MuxStream,
        head: RequestHead,
        headers: Headers,
        authorization: str | None,
        review: ApiRequest | None = None,
    ) -> None:
        """Relay a plain request through the agent's own client."""
        response = await self._open(stream, head, headers, authorization)
        if isinstance(response, Refusal):
            await _answer_status(stream, response)
            return
        if review is not None:
            await self._narrowed(stream, head, response, review)
            return
        with response:
            self.requests[(head.method.lower(), response.status)] += 1
            kept = [
                (name, value)
                for name, value in response.headers
                if name not in DROPPED_RESPONSE_HEADERS
            ]
            # The first body bytes, if they came with the head, share its frame.
            await stream.write(
                encode_response_head(response.status, response.reason, kept)
                + response.read_nowait()
            )
            try:
                while chunk := await response.read():
                    await stream.write(chunk)
            except UpstreamError as exc:
                # The head is gone: a reset is how the caller learns of the break.
                logger.warning("the API server's answer broke off: %s", exc)
                stream.reset(ErrorCode.CANCEL, "the API server's answer broke off")
                return
        stream.end()

    async def _narrowed(
        self, stream: MuxStream, head: RequestHead, response: UpstreamResponse, review: ApiRequest
    ) -> None:
        """Answer a review with the API server's answer, narrowed by the policy."""
        with response:
            self.requests[(head.method.lower(), response.status)] += 1
            body = response.read_nowait()
            try:
                while len(body) <= MAX_REVIEW and (chunk := await response.read()):
                    body += chunk
            except UpstreamError as exc:
                logger.warning("the API server's answer broke off: %s", exc)
                stream.reset(ErrorCode.CANCEL, "the API server's answer broke off")
                return
            status, reason, kept = response.status, response.reason, response.headers
        if len(body) > MAX_REVIEW:
            await _answer_status(
                stream, Refusal(502, "BadGateway", "the API server's review answer is too large")
            )
            return
        narrowed = narrow_review(self.policy, review, body) if status == 201 else None
        if narrowed is not None:
            body = narrowed
        headers = [
            (name, value)
            for name, value in kept
            if name not in DROPPED_RESPONSE_HEADERS
            and name not in ("content-length", "transfer-encoding")
        ]
        headers.append(("content-length", str(len(body))))
        await stream.write(encode_response_head(status, reason, headers) + body)
        stream.end()

    async def _open(
        self,
        stream: MuxStream,
        head: RequestHead,
        headers: Headers,
        authorization: str | None,
    ) -> UpstreamResponse | Refusal:
        """The API server's answer, or the refusal to answer the caller with."""
        try:
            if self._pool is None:
                self._pool = UpstreamPool(self.api.base_url, self.api.ssl_context)
            return await self._pool.request(
                head.method,
                head.path,
                headers,
                None if stream.at_eof else stream.read,
                authorization=authorization,
            )
        except UpstreamRequestError as exc:
            logger.info("cannot relay %s %s: %s", head.method, head.path[:200], exc)
            return Refusal(400, "BadRequest", f"the agent cannot relay this: {exc}")
        except UpstreamError as exc:
            logger.warning("cannot relay %s %s: %s", head.method, head.path[:200], exc)
            what = "reach" if isinstance(exc, UpstreamConnectError) else "relay the answer of"
            return Refusal(502, "BadGateway", f"the agent cannot {what} the API server: {exc}")


async def _answer_status(stream: MuxStream, refusal: Refusal) -> None:
    """Answer with a Kubernetes Status, as the API server would (``error_answer``)."""
    body, content_type = error_answer(
        refusal.status, refusal.reason, refusal.message, _accept_of(stream)
    )
    head = encode_response_head(
        refusal.status,
        refusal.reason,
        [("content-type", content_type), ("content-length", str(len(body)))],
    )
    try:
        await stream.write(head + body)
        stream.end()
    except SessionError:
        stream.reset(ErrorCode.CANCEL)


def _accept_of(stream: MuxStream) -> str:
    """The request's Accept header, looked for in the OPEN's headers even if they are invalid."""
    headers = stream.headers.get("headers")
    if isinstance(headers, list | tuple):
        for pair in headers:
            if isinstance(pair, list | tuple) and len(pair) == 2 and pair[0] == "accept":
                value = pair[1]
                return value if isinstance(value, str) else ""
    return ""
