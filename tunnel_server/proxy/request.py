"""A proxied Kubernetes API request's life, whoever parsed it.

Two front ends serve ``/k8s/clusters/{cluster}/...``: the lean one
(:mod:`tunnel_server.edge.frontdoor`, plain requests) and aiohttp's route
(:mod:`tunnel_server.proxy.kubeproxy`, upgrades and anything unusual). Each
makes one :class:`ProxiedRequest` per request and does only the I/O with the
caller; the request object does the rest, from its first check to its audit
event: it authenticates the caller, checks the grant, rewrites the identity
(:mod:`tunnel_server.proxy.identity`), opens the ``http`` stream on the
cluster's agent session, streams the body up in a task it owns, reads the
agent's answer head (:mod:`tunnel_server.proxy.answer`), and when it closes,
releases the request, ends what is left of its stream and records the metrics
and the audit event. A refusal is a
:class:`~tunnel_server.proxy.refusal.ProxyRefusal`, answered as a Kubernetes
``Status``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from protocol import kinds
from protocol.errors import HeaderTooLargeError, LocalProtocolError
from protocol.http import RequestHead, ResponseHead
from tunnel_kube import UNPLAIN_PATH, is_plain_path, parse_api_request
from tunnel_mux import MuxStream, Session, SessionError
from tunnel_server.access.auth import parse_bearer
from tunnel_server.context import ServerContext
from tunnel_server.errors import UnauthorizedError
from tunnel_server.proxy.answer import read_response_head
from tunnel_server.proxy.credential import Credential, recorded_identity
from tunnel_server.proxy.exchange import ProxyExchange
from tunnel_server.proxy.identity import forwarded_headers
from tunnel_server.proxy.refusal import ProxyRefusal, offline_refusal
from tunnel_server.replicas.links import LinkError
from tunnel_server.replicas.relay import CLUSTER_HEADER
from tunnel_server.store.base import Grant, ProxyAuditRecord, StoreError, User, hash_token

__all__ = ["HEAD_WITH_BODY", "CallerMemo", "ProxiedRequest", "cluster_of", "upstream_path"]

logger = logging.getLogger(__name__)

#: Why a HEAD request with a body is refused (an upgrade's: kubeproxy.py).
HEAD_WITH_BODY = (
    "a HEAD request cannot carry a body: send it without Content-Length or Transfer-Encoding"
)
# A cluster name as it appears, unencoded, in the path.
_CLUSTER = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


def cluster_of(raw_target: str) -> str | None:
    """The cluster a raw ``/k8s/clusters/{cluster}/...`` target names, if well-formed."""
    rest = raw_target[len("/k8s/clusters/") :]
    end = rest.find("/")
    if not raw_target.startswith("/k8s/clusters/") or end <= 0:
        return None
    name = rest[:end]
    return name if _CLUSTER.fullmatch(name) else None


@dataclass(slots=True)
class CallerMemo:
    """What the server decided for the last request of one caller connection.

    The lean front end keeps one per connection. kubectl sends the same
    header lines with every request on a connection, which its parse gives as
    the same tuple (:class:`~tunnel_server.edge.http1.HeaderBlockCache`); while it
    does, to the same cluster, the caller's user and the headers forwarded
    for it are those decided for the last request. Only until the access
    cache's answers it came from expire, and not after any change to users,
    tokens or grants (:attr:`AccessCache.generation`). Refusals are never kept.
    """

    headers: Iterable[tuple[str, str]] | None = None
    cluster: str = ""
    upgrade: str | None = None
    generation: int = -1
    until: float = 0.0
    user: str = ""
    forwarded: tuple[tuple[str, str], ...] = ()
    credential: Credential | None = None


class ProxiedRequest:
    """One proxied request, from its first check to its audit event.

    The front end that parsed the request makes it, calls :meth:`open`, then
    :meth:`upload` for a body and :meth:`response_head` for the answer, and
    relays the answer's body from :attr:`stream` to its caller; whatever
    happened, it calls :meth:`release` at once and :meth:`close` last.
    """

    context: ServerContext
    #: What the audit event and the metrics record of the request.
    exchange: ProxyExchange
    #: The request's stream to the agent, once opened.
    stream: MuxStream | None
    _uploader: asyncio.Task[None] | None

    def __init__(self, context: ServerContext, cluster: str, method: str) -> None:
        self.context = context
        self.exchange = ProxyExchange(cluster, method)
        self.stream = None
        self._uploader = None

    async def open(
        self,
        raw_target: str,
        headers: Iterable[tuple[str, str]],
        *,
        upgrade: str | None,
        has_body: bool,
        memo: CallerMemo | None = None,
    ) -> MuxStream:
        """Check the caller and open the request's stream to the cluster's agent.

        ``headers`` are the caller's, names in lower case; ``memo``, if given,
        remembers the decision for the connection's next request. Raises
        :class:`ProxyRefusal` with the status to answer.
        """
        context = self.context
        exchange = self.exchange
        cluster = exchange.cluster
        if exchange.method == "HEAD" and has_body:
            raise ProxyRefusal(400, "BadRequest", HEAD_WITH_BODY)
        access = context.access
        # Read before asking: an invalidation while the answers load is seen next time.
        generation = access.generation
        remembered = (
            memo
            if memo is not None
            and memo.headers is headers
            and memo.cluster == cluster
            and memo.upgrade == upgrade
            and memo.generation == generation
            and access.clock() < memo.until
            else None
        )
        if remembered is not None:
            exchange.user = remembered.user
        else:
            until, token_hash, user, grant = await self._authorize(headers)
        path = upstream_path(raw_target, cluster)
        exchange.path = path.split("?", 1)[0]
        api_request = parse_api_request(exchange.method, path)
        # exec, attach, portforward are audited as what they are, not as get/create
        # (the legacy /proxy/ verb has no subresource: its verb says proxy).
        connect = api_request.is_connect
        exchange.verb = (
            (api_request.subresource or api_request.verb) if connect else api_request.verb
        )
        if remembered is not None:
            forwarded = remembered.forwarded
            credential = remembered.credential
            assert credential is not None
        else:
            forwarded = tuple(forwarded_headers(headers, upgrade, user, grant))
            requested = tuple(header for header in headers if header[0].startswith("impersonate-"))
            identity = [header for header in forwarded if header[0].startswith("impersonate-")]
            credential = Credential(
                token_hash,
                user.name,
                cluster,
                requested,
                frozenset(identity),
                recorded_identity(identity, bool(requested)),
            )
            if memo is not None:
                memo.headers = headers
                memo.cluster = cluster
                memo.upgrade = upgrade
                memo.generation = generation
                memo.until = until
                memo.user = user.name
                memo.forwarded = forwarded
                memo.credential = credential
        exchange.identity = credential.recorded
        # No one user takes all the streams of a cluster's session from the others.
        most = context.settings.tunnel.max_requests_per_user
        if context.live.count(credential.user, cluster) >= most:
            raise ProxyRefusal(
                429,
                "TooManyRequests",
                f"user {credential.user} has {most} requests in progress on cluster {cluster}, "
                "the most one user may have; end some (watches, logs -f, exec, port-forward)",
            )
        head = RequestHead(exchange.method, path, forwarded, upgrade is not None)
        open_headers = head.to_open_headers()
        agent = context.registry.get(cluster)
        if agent is not None:
            session = agent.session
        else:
            # Held by another replica, or offline: fail fast, no waiting for an agent.
            session = await self._owner_link(cluster)
            open_headers[CLUSTER_HEADER] = cluster
        try:
            stream = session.open_stream(kinds.STREAM_HTTP, open_headers, end_stream=not has_body)
        except HeaderTooLargeError as exc:
            # Not worth a retry: the same request is as large the next time.
            raise ProxyRefusal(
                431, "RequestHeaderFieldsTooLarge", f"the request's headers are too large: {exc}"
            ) from exc
        except (LocalProtocolError, SessionError) as exc:
            raise ProxyRefusal(
                503, "ServiceUnavailable", f"cluster {cluster} cannot take the request now: {exc}"
            ) from exc
        # Checked again whenever access changes, for as long as it lasts.
        context.live.add(stream, credential, generation, exchange)
        exchange.stream = stream
        self.stream = stream
        # In a burst of requests, the agent starts on the first while the rest are read.
        try:
            await session.send_if_due()
        except BaseException:
            stream.reset()  # the caller never gets it: cancelled, it must not stay open
            raise
        return stream

    async def _owner_link(self, cluster: str) -> Session:
        """The link to the replica that holds ``cluster``'s agent, or the refusal."""
        context = self.context
        links = context.links
        if links is None:
            raise offline_refusal(cluster, context.registry.offline_for(cluster))
        try:
            owner = await context.replicas.owner(cluster)
        except StoreError as exc:
            logger.warning("cannot find where a cluster is served: %s", exc)
            raise ProxyRefusal(
                503,
                "ServiceUnavailable",
                f"the server cannot find where cluster {cluster} is served now; retry shortly",
            ) from exc
        if owner is None:
            raise offline_refusal(cluster, context.registry.offline_for(cluster))
        try:
            session = await links.session_to(owner)
        except LinkError as exc:
            context.replicas.forget_owner(cluster)
            logger.warning("%s", exc, extra={"cluster": cluster})
            raise ProxyRefusal(
                503,
                "ServiceUnavailable",
                f"cluster {cluster}'s agent is on server replica {owner.replica}, which cannot "
                "be reached now; its agent moves to another replica on its own: retry shortly",
            ) from exc
        self.exchange.served_by = owner.replica
        return session

    async def _authorize(
        self, headers: Iterable[tuple[str, str]]
    ) -> tuple[float, str, User, Grant]:
        """The caller's user and grant on the request's cluster, or the refusal to answer.

        Also until when (on the access cache's clock) both answers hold, and the
        hash of the caller's token.
        """
        context = self.context
        exchange = self.exchange
        cluster = exchange.cluster
        authorization = ""
        for name, value in headers:
            if name == "authorization":
                authorization = value
                break
        try:
            token = parse_bearer(authorization)
        except UnauthorizedError as exc:
            raise ProxyRefusal(401, "Unauthorized", exc.message) from exc
        try:
            token_hash = hash_token(token)
            user_until, user = await context.access.lookup_user_by_hash(token_hash)
            grant_until, grant = (
                (0.0, None)
                if user is None
                else await context.access.lookup_grant(user.name, cluster)
            )
        except StoreError as exc:
            # The store's text may be SQLite's: logged here, not told to a caller
            # whose token is not even checked yet.
            logger.warning("cannot authenticate a proxied request: %s", exc)
            raise ProxyRefusal(
                503, "ServiceUnavailable", "the server cannot read its state now; retry shortly"
            ) from exc
        if user is None:
            raise ProxyRefusal(
                401, "Unauthorized", "the API token is not valid (unknown, expired or revoked)"
            )
        exchange.user = user.name  # from here on, refusals are audited under the user
        if grant is None:
            raise ProxyRefusal(
                403, "Forbidden", f"user {user.name} has no grant on cluster {cluster}"
            )
        return min(user_until, grant_until), token_hash, user, grant

    def upload(self, read: Callable[[], Awaitable[bytes]]) -> None:
        """Stream the caller's body to the agent (``read`` gives its parts, b"" at its end).

        In a task of this request's own, ended by :meth:`close`.
        """
        assert self.stream is not None
        self._uploader = asyncio.get_running_loop().create_task(
            _upload(read, self.stream, self.exchange)
        )

    async def response_head(self, *, upgrade: bool = False) -> tuple[ResponseHead, bytes]:
        """The agent's answer head and the body bytes that came with it, or the refusal.

        Only an ``upgrade`` may be answered 101; other interim answers are refused.
        """
        assert self.stream is not None
        return await read_response_head(self.stream, self.exchange, upgrade=upgrade)

    def release(self) -> None:
        """The request has ended: the server no longer holds it as live (at once, no await)."""
        exchange = self.exchange
        if exchange.stream is not None:
            self.context.live.discard(exchange.stream)
            exchange.stream = None

    async def close(self) -> None:
        """End what is left of the request, and record its metrics and audit event.

        The body's upload stops; a stream neither side ended is reset, so the
        agent ends the request at the API server. The audit event is for an
        authenticated caller only.
        """
        self.release()
        uploader = self._uploader
        if uploader is not None:
            self._uploader = None
            uploader.cancel()  # an upload cut short resets the stream (see _upload)
            await asyncio.gather(uploader, return_exceptions=True)
        stream = self.stream
        if stream is not None and stream.error is None and not stream.at_eof:
            stream.reset()
        context = self.context
        exchange = self.exchange
        elapsed = time.monotonic() - exchange.started
        context.metrics.observe_proxy(
            exchange.verb or exchange.method.lower(), exchange.status, elapsed
        )
        if exchange.user is not None:
            await context.audit.record(
                ProxyAuditRecord(
                    time.time_ns() // 1000,
                    exchange.user,
                    exchange.cluster,
                    exchange.verb,
                    exchange.path[:512],
                    exchange.status,
                    exchange.bytes_in,
                    exchange.bytes_out,
                    round(elapsed * 1000),
                    exchange.ended,
                    exchange.identity,
                    context.replicas.record_of(exchange.served_by),
                )
            )


async def _upload(
    read: Callable[[], Awaitable[bytes]], stream: MuxStream, exchange: ProxyExchange
) -> None:
    try:
        while data := await read():
            exchange.bytes_in += len(data)
            await stream.write(data)
        stream.end()
    except SessionError:
        pass  # the response side reports it
    except ConnectionError:
        stream.reset()  # the caller went away
    except asyncio.CancelledError:
        # Answered before the whole body went: the stream would stay half
        # open on both sides (the agent stopped reading it). End it.
        stream.reset()
        raise


def upstream_path(raw_target: str, cluster: str) -> str:
    """The path (and query) to ask the cluster's API server for, or 400."""
    prefix = f"/k8s/clusters/{cluster}"
    if (
        not raw_target.startswith(prefix + "/")
        and raw_target != prefix
        and not raw_target.startswith(prefix + "?")
    ):
        raise ProxyRefusal(400, "BadRequest", "the cluster name must not be encoded")
    rest = raw_target[len(prefix) :] or "/"
    if rest.startswith("?"):
        rest = "/" + rest
    path, _, query = rest.partition("?")
    if not is_plain_path(path):
        raise ProxyRefusal(400, "BadRequest", UNPLAIN_PATH)
    return f"{path}?{query}" if query else path
