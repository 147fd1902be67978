"""What every proxied Kubernetes API request goes through, whoever parsed it.

Two front ends serve ``/k8s/clusters/{cluster}/...``: the lean one
(:mod:`tunnel_server.edge.frontdoor`, plain requests) and aiohttp's route
(:mod:`tunnel_server.proxy.kubeproxy`, upgrades and anything unusual). Both call
:func:`open_relay` to authenticate the caller, check the grant, rewrite the
identity and open the ``http`` stream on the cluster's agent session, and
:func:`finish` to record the metrics and the audit event; a refusal is a
:class:`~tunnel_server.proxy.refusal.ProxyRefusal`, answered as a Kubernetes
``Status`` (:mod:`tunnel_server.proxy.refusal`).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

from protocol import kinds
from protocol.errors import HeaderTooLargeError, LocalProtocolError
from protocol.http import HOP_BY_HOP, RequestHead
from tunnel_kube import UNPLAIN_PATH, is_plain_path, parse_api_request
from tunnel_mux import MuxStream, SessionError
from tunnel_server.access.auth import parse_bearer
from tunnel_server.access.cache import AccessCache
from tunnel_server.context import ServerContext
from tunnel_server.errors import UnauthorizedError
from tunnel_server.proxy.credential import Credential
from tunnel_server.proxy.exchange import ProxyExchange
from tunnel_server.proxy.refusal import ProxyRefusal, offline_refusal
from tunnel_server.store.base import Grant, ProxyAuditRecord, StoreError, User, hash_token

__all__ = [
    "DROPPED_RESPONSE_HEADERS",
    "HEAD_WITH_BODY",
    "IDENTITY_PREFIX",
    "CallerMemo",
    "access_refusal",
    "answer_headers",
    "cluster_of",
    "finish",
    "forwarded_headers",
    "identity_headers",
    "impersonation_headers",
    "open_relay",
    "release",
    "upload",
    "upstream_path",
]

logger = logging.getLogger(__name__)

#: Every identity the server asserts in a cluster carries this prefix.
IDENTITY_PREFIX = "tunnel:"

# Never forwarded: hop-by-hop headers, and the caller's own credentials.
_DROPPED = HOP_BY_HOP | {
    "authorization",
    "proxy-authorization",
    "cookie",
    "host",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
}
#: Headers of the agent's answer never passed to the caller: hop-by-hop ones, and
#: cookies (the API server sets none; an agent's would be this server's).
DROPPED_RESPONSE_HEADERS = (HOP_BY_HOP - {"upgrade"}) | {"set-cookie"}
#: Why a HEAD request with a body is refused (an upgrade's: kubeproxy.py).
HEAD_WITH_BODY = (
    "a HEAD request cannot carry a body: send it without Content-Length or Transfer-Encoding"
)
# A cluster name as it appears, unencoded, in the path.
_CLUSTER = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


def impersonation_headers(user: User, grant: Grant) -> list[tuple[str, str]]:
    """The identity the cluster sees: ``tunnel:<user>`` in ``tunnel:<group>`` groups."""
    headers = [("impersonate-user", IDENTITY_PREFIX + user.name)]
    for group in dict.fromkeys((*user.groups, *grant.as_groups)):
        headers.append(("impersonate-group", IDENTITY_PREFIX + group))
    return headers


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


async def open_relay(
    context: ServerContext,
    exchange: ProxyExchange,
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
        until, token_hash, user, grant = await _authorize(context, exchange, headers)
    path = upstream_path(raw_target, cluster)
    exchange.path = path.split("?", 1)[0]
    api_request = parse_api_request(exchange.method, path)
    # exec, attach, portforward are audited as what they are, not as get/create
    # (the legacy /proxy/ verb has no subresource: its verb says proxy).
    connect = api_request.is_connect
    exchange.verb = (api_request.subresource or api_request.verb) if connect else api_request.verb
    if remembered is not None:
        forwarded = remembered.forwarded
        credential = remembered.credential
        assert credential is not None
    else:
        forwarded = tuple(forwarded_headers(headers, upgrade, user, grant))
        credential = Credential(
            token_hash,
            user.name,
            cluster,
            tuple(header for header in headers if header[0].startswith("impersonate-")),
            frozenset(header for header in forwarded if header[0].startswith("impersonate-")),
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
    # No one user takes all the streams of a cluster's session from the others.
    most = context.settings.tunnel.max_requests_per_user
    if context.live.count(credential.user, cluster) >= most:
        raise ProxyRefusal(
            429,
            "TooManyRequests",
            f"user {credential.user} has {most} requests in progress on cluster {cluster}, "
            "the most one user may have; end some (watches, logs -f, exec, port-forward)",
        )
    agent = context.registry.get(cluster)
    if agent is None:
        # Fail fast: no waiting for an agent that may never come.
        raise offline_refusal(cluster, context.registry.offline_for(cluster))
    head = RequestHead(exchange.method, path, forwarded, upgrade is not None)
    try:
        stream = agent.session.open_stream(
            kinds.STREAM_HTTP, head.to_open_headers(), end_stream=not has_body
        )
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
    # In a burst of requests, the agent starts on the first while the rest are read.
    try:
        await agent.session.send_if_due()
    except BaseException:
        stream.reset()  # the caller never gets it: cancelled, it must not stay open
        raise
    return stream


async def _authorize(
    context: ServerContext, exchange: ProxyExchange, headers: Iterable[tuple[str, str]]
) -> tuple[float, str, User, Grant]:
    """The caller's user and grant on the exchange's cluster, or the refusal to answer.

    Also until when (on the access cache's clock) both answers hold, and the
    hash of the caller's token.
    """
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
            (0.0, None) if user is None else await context.access.lookup_grant(user.name, cluster)
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
        raise ProxyRefusal(403, "Forbidden", f"user {user.name} has no grant on cluster {cluster}")
    return min(user_until, grant_until), token_hash, user, grant


def release(context: ServerContext, exchange: ProxyExchange) -> None:
    """The request has ended: the server no longer holds it as live (at once, no await)."""
    if exchange.stream is not None:
        context.live.discard(exchange.stream)
        exchange.stream = None


async def finish(context: ServerContext, exchange: ProxyExchange) -> None:
    """Release the request, record its metrics and, for an authenticated caller, its audit event."""
    release(context, exchange)
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
            )
        )


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


def forwarded_headers(
    headers: Iterable[tuple[str, str]], upgrade: str | None, user: User, grant: Grant
) -> list[tuple[str, str]]:
    """The caller's headers as the agent gets them: no credentials, our identity."""
    forwarded: list[tuple[str, str]] = []
    impersonated: list[tuple[str, str]] = []
    for name, value in headers:
        if name.startswith("impersonate-"):
            impersonated.append((name, value))
        elif name not in _DROPPED and not (upgrade is not None and name == "content-length"):
            forwarded.append((name, value))
    if upgrade is not None:
        forwarded.append(("connection", "Upgrade"))
        forwarded.append(("upgrade", upgrade))
    forwarded.extend(identity_headers(impersonated, user, grant))
    return forwarded


def identity_headers(
    requested: Sequence[tuple[str, str]], user: User, grant: Grant
) -> list[tuple[str, str]]:
    """The ``Impersonate-*`` headers that tell the cluster who the caller is.

    ``requested`` are the caller's own (names in lower case): its
    ``--as``/``--as-group``, refused unless the grant allows them. Without
    them, ``tunnel:<user>`` in the user's and the grant's groups.
    """
    if requested:
        return _caller_impersonation(requested, user, grant)
    return impersonation_headers(user, grant)


async def access_refusal(access: AccessCache, credential: Credential) -> str | None:
    """Why a new request with ``credential`` would be refused now; None if it would not.

    Raises :class:`StoreError` if the store cannot be read.
    """
    _, user = await access.lookup_user_by_hash(credential.token_hash)
    if user is None:
        return "the caller's API token expired or was revoked, or its user was deleted"
    _, grant = await access.lookup_grant(user.name, credential.cluster)
    if grant is None:
        return f"user {user.name} no longer has a grant on cluster {credential.cluster}"
    try:
        identity = frozenset(identity_headers(credential.requested, user, grant))
    except ProxyRefusal as refusal:
        return refusal.message
    if identity != credential.identity:
        return f"the identity of user {user.name} on cluster {credential.cluster} changed"
    return None


def _caller_impersonation(
    requested: Sequence[tuple[str, str]], user: User, grant: Grant
) -> list[tuple[str, str]]:
    """The caller's own --as/--as-group, allowed only by its grant, inside our prefix."""
    if not grant.impersonate:
        raise ProxyRefusal(
            403,
            "Forbidden",
            f"user {user.name} may not impersonate on this cluster "
            "(Impersonate-* headers are refused without an impersonate grant)",
        )
    headers = []
    for name, value in requested:
        if name not in ("impersonate-user", "impersonate-group"):
            raise ProxyRefusal(403, "Forbidden", f"the {name} header is not supported")
        if value.startswith("system:") or not value or len(value) > 256:
            raise ProxyRefusal(403, "Forbidden", f"{value[:64]!r} cannot be impersonated")
        prefixed = value if value.startswith(IDENTITY_PREFIX) else IDENTITY_PREFIX + value
        if prefixed.startswith(IDENTITY_PREFIX + "system"):
            # As the agent refuses it: the server does not lean on the agent's check alone.
            raise ProxyRefusal(403, "Forbidden", f"{value[:64]!r} cannot be impersonated")
        headers.append((name, prefixed))
    if not any(name == "impersonate-user" for name, _ in headers):
        raise ProxyRefusal(403, "Forbidden", "Impersonate-Group needs Impersonate-User")
    return headers


async def upload(
    read: Callable[[], Awaitable[bytes]], stream: MuxStream, exchange: ProxyExchange
) -> None:
    """Stream the caller's request body (``read`` gives its parts, b"" at its end) to the agent."""
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
