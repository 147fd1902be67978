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
llhttp cannot tell have no body) go through aiohttp's client.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import Counter
from collections.abc import AsyncIterator
from typing import cast

import aiohttp

from protocol.errors import ErrorCode, MalformedFrameError
from protocol.http import Headers, RequestHead, encode_response_head
from tunnel_kube import status_body
from tunnel_mux import MuxStream, SessionError
from tunnel_mux.upgraded import UpgradedReader

from .kubeapi import KubeApi
from .policy import ProxyPolicy
from .upstream import UpstreamConnectError, UpstreamError, UpstreamPool, UpstreamRequestError

__all__ = ["KubeProxy"]

logger = logging.getLogger(__name__)

# Headers the agent never passes to the API server: hop-by-hop ones, and
# credentials (it sends its own).
_DROPPED_REQUEST = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "cookie",
        "host",
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        # The server already answered the caller's Expect; the body streams as it comes.
        "expect",
    }
)
_DROPPED_RESPONSE = frozenset({"connection", "keep-alive", "transfer-encoding", "trailer"})


@functools.lru_cache(maxsize=64)
def _forwarded(headers: Headers) -> Headers:
    """The caller's headers the agent passes on (remembered per block, as the policy's answer)."""
    return tuple((name, value) for name, value in headers if name not in _DROPPED_REQUEST)


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
        try:
            head = RequestHead.from_open_headers(stream.headers)
        except MalformedFrameError as exc:
            await _answer_status(stream, 400, "BadRequest", f"invalid request: {exc}")
            return
        refusal = self.policy.check(head)
        if refusal is not None:
            self.refusals += 1
            logger.info("refused %s %s: %s", head.method, head.path[:200], refusal.message)
            await _answer_status(stream, refusal.status, refusal.reason, refusal.message)
            return
        authorization = await self.api.authorization()
        if not head.upgrade and head.method != "HEAD":
            await self._request(stream, head, _forwarded(head.headers), authorization)
            return
        headers = list(_forwarded(head.headers))
        if authorization:
            headers.append(("authorization", authorization))
        if head.upgrade:
            headers.append(("connection", "Upgrade"))
            upgrade = next((v for n, v in head.headers if n == "upgrade"), "")
            headers.append(("upgrade", upgrade))
        try:
            if head.upgrade:
                await self._upgrade(stream, head, headers)
            else:
                await self._request_aiohttp(stream, head, headers)
        except (aiohttp.ClientError, OSError) as exc:
            logger.warning("cannot reach the API server: %s", exc)
            await _answer_status(
                stream, 502, "BadGateway", f"the agent cannot reach the API server: {exc}"
            )

    async def _request(
        self,
        stream: MuxStream,
        head: RequestHead,
        headers: Headers,
        authorization: str | None,
    ) -> None:
        """Relay a plain request through the agent's own client."""
        try:
            if self._pool is None:
                self._pool = UpstreamPool(self.api.base_url, self.api.ssl_context)
            response = await self._pool.request(
                head.method,
                head.path,
                headers,
                None if stream.at_eof else stream.read,
                authorization=authorization,
            )
        except UpstreamRequestError as exc:
            logger.info("cannot relay %s %s: %s", head.method, head.path[:200], exc)
            await _answer_status(stream, 400, "BadRequest", f"the agent cannot relay this: {exc}")
            return
        except UpstreamError as exc:
            logger.warning("cannot relay %s %s: %s", head.method, head.path[:200], exc)
            what = "reach" if isinstance(exc, UpstreamConnectError) else "relay the answer of"
            await _answer_status(
                stream, 502, "BadGateway", f"the agent cannot {what} the API server: {exc}"
            )
            return
        with response:
            self.requests[(head.method.lower(), response.status)] += 1
            kept = [
                (name, value) for name, value in response.headers if name not in _DROPPED_RESPONSE
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

    async def _request_aiohttp(
        self, stream: MuxStream, head: RequestHead, headers: list[tuple[str, str]]
    ) -> None:
        has_body = not stream.at_eof
        async with self.api.session.request(
            head.method,
            self.api.url(head.path),
            headers=headers,
            data=_body(stream) if has_body else None,
            allow_redirects=False,
            compress=None,
        ) as response:
            self.requests[(head.method.lower(), response.status)] += 1
            await stream.write(
                encode_response_head(
                    response.status, response.reason or "", _response_headers(response)
                )
            )
            async for chunk in response.content.iter_any():
                await stream.write(chunk)
        stream.end()

    async def _upgrade(
        self, stream: MuxStream, head: RequestHead, headers: list[tuple[str, str]]
    ) -> None:
        response = await self.api.session.request(
            head.method,
            self.api.url(head.path),
            headers=headers,
            allow_redirects=False,
        )
        try:
            await stream.write(
                encode_response_head(
                    response.status, response.reason or "", _response_headers(response)
                )
            )
            if response.status != 101:
                async for chunk in response.content.iter_any():
                    await stream.write(chunk)
                stream.end()
                return
            connection = response.connection
            assert connection is not None
            assert connection.protocol is not None
            reader = UpgradedReader(connection.transport)
            connection.protocol.read_timeout = None
            connection.protocol.set_parser(reader, reader)
            transport = connection.transport
            assert transport is not None
            await _splice(stream, reader, transport)
        finally:
            response.close()


async def _splice(
    stream: MuxStream, reader: UpgradedReader, transport: asyncio.BaseTransport
) -> None:
    """Relay bytes between the stream and the API server's upgraded connection."""
    # A cast, not an isinstance check: uvloop's transports are not subclasses
    # of asyncio's (an assert here broke exec and port-forward under uvloop).
    transport = cast(asyncio.WriteTransport, transport)

    async def to_api_server() -> None:
        while chunk := await stream.read():
            transport.write(chunk)
        if transport.can_write_eof():
            transport.write_eof()  # the caller half-closed (e.g. stdin EOF)

    async def to_caller() -> None:
        while chunk := await reader.read():
            await stream.write(chunk)
        stream.end()

    upward = asyncio.create_task(to_api_server())
    try:
        await to_caller()
    finally:
        upward.cancel()
        with contextlib.suppress(asyncio.CancelledError, SessionError, ConnectionError):
            await upward


async def _body(stream: MuxStream) -> AsyncIterator[bytes]:
    while chunk := await stream.read():
        yield chunk


def _response_headers(response: aiohttp.ClientResponse) -> list[tuple[str, str]]:
    # A 101 keeps Connection and Upgrade: they are what switches protocols.
    dropped = _DROPPED_RESPONSE - {"connection"} if response.status == 101 else _DROPPED_RESPONSE
    headers = []
    for raw_name, raw_value in response.raw_headers:
        name = raw_name.decode("latin-1").lower()
        if name not in dropped:
            headers.append((name, raw_value.decode("latin-1")))
    return headers


async def _answer_status(stream: MuxStream, code: int, reason: str, message: str) -> None:
    """Answer with a Kubernetes Status, as the API server would."""
    body = status_body(code, reason, message)
    try:
        await stream.write(
            encode_response_head(
                code,
                reason,
                [("content-type", "application/json"), ("content-length", str(len(body)))],
            )
            + body
        )
        stream.end()
    except SessionError:
        stream.reset(ErrorCode.CANCEL)
