"""The links between replicas: one mTLS WebSocket per pair and direction, many streams.

A replica that receives a request for a cluster held elsewhere forwards it
on its link to the owner (:class:`PeerLinks` dials it on first use, keeps it,
and dials again once it is gone). The owner accepts links on its internal
port (:func:`peer_app`), which only replicas reach: both sides present a
certificate the server CA issued to a replica (``urn:tunnel:replica:<name>``,
``tunnel_pki.ca.CertificateAuthority.issue_replica_certificate``), each checks
the other's, and the dialer checks that the replica that answered is the one
the database named. A link is a :class:`~tunnel_mux.Session` like an
agent's, so forwarded requests keep the protocol's per-stream flow control
and bounds; only the dialer opens streams.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import ssl
from collections.abc import Callable
from datetime import datetime

import aiohttp
from aiohttp import web

from protocol import Connection, Keepalive, Limits, Side, kinds
from tunnel_mux import MuxStream, Session, SessionClosedError, SessionHandlers, WebSocketTransport
from tunnel_pki.errors import PkiError
from tunnel_pki.identity import verify_replica_certificate
from tunnel_pki.tls import client_context, server_context
from tunnel_server import __version__
from tunnel_server.agents.registry import AgentRegistry
from tunnel_server.errors import ServerError
from tunnel_server.replicas.relay import relay_forwarded
from tunnel_server.store.replicas import SessionOwner

__all__ = [
    "LINK_PATH",
    "LinkError",
    "PeerLinks",
    "ReplicaTls",
    "link_limits",
    "peer_app",
]

logger = logging.getLogger(__name__)

#: Where a replica's internal port accepts links.
LINK_PATH = "/replica/v1/link"
#: Seconds to dial another replica, TLS and handshake included.
DIAL_TIMEOUT = 3.0


class LinkError(ServerError):
    """Another replica cannot be reached, or is not the replica it should be."""


@dataclasses.dataclass(frozen=True, slots=True)
class ReplicaTls:
    """This replica's certificate for its links, and the CA both ends trust."""

    name: str
    cert_pem: bytes
    key_pem: bytes
    ca_pem: bytes
    #: Now, for checking a peer's certificate.
    clock: Callable[[], datetime]

    def server_context(self) -> ssl.SSLContext:
        return server_context(self.cert_pem, self.key_pem, self.ca_pem, require_client_cert=True)

    def client_context(self) -> ssl.SSLContext:
        return client_context(self.ca_pem, cert_pem=self.cert_pem, key_pem=self.key_pem)

    def peer_of(self, ssl_object: object) -> str:
        """The replica whose certificate the other end of a TLS connection presented."""
        der = (
            ssl_object.getpeercert(binary_form=True)
            if isinstance(ssl_object, ssl.SSLObject | ssl.SSLSocket)
            else None
        )
        if not der:
            raise LinkError("the other end presented no certificate")
        try:
            return verify_replica_certificate(der, self.ca_pem, self.clock())
        except PkiError as exc:
            raise LinkError(f"the other end is not a server replica: {exc}") from exc


def link_limits(limits: Limits) -> Limits:
    """A link's limits: an agent's, with room for the streams of every cluster it serves."""
    return dataclasses.replace(limits, max_streams=limits.max_streams * 4)


class PeerLinks:
    """This replica's links to the others, dialed when first needed."""

    def __init__(self, tls: ReplicaTls, limits: Limits, keepalive: Keepalive) -> None:
        self._tls = tls
        self._context: ssl.SSLContext | None = None
        self._limits = link_limits(limits)
        self._keepalive = keepalive
        self._links: dict[str, tuple[str, Session]] = {}
        self._dialing: dict[str, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._http: aiohttp.ClientSession | None = None
        #: Links dialed since start (for tests and metrics).
        self.dialed = 0

    async def session_to(self, owner: SessionOwner) -> Session:
        """An open link to the replica ``owner`` names; raises :class:`LinkError`."""
        link = self._links.get(owner.replica)
        if link is not None and link[0] == owner.address and link[1].is_open:
            return link[1]
        lock = self._dialing.setdefault(owner.replica, asyncio.Lock())
        async with lock:
            link = self._links.get(owner.replica)
            if link is not None and link[0] == owner.address and link[1].is_open:
                return link[1]
            session = await self._dial(owner)
            self._links[owner.replica] = (owner.address, session)
            return session

    async def close(self) -> None:
        """Close every link and wait for their tasks."""
        for _, session in list(self._links.values()):
            await session.close()
        self._links.clear()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._http is not None:
            await self._http.close()

    async def _dial(self, owner: SessionOwner) -> Session:
        if self._context is None:
            self._context = self._tls.client_context()
            self._http = aiohttp.ClientSession()
        assert self._http is not None
        url = f"wss://{owner.address}{LINK_PATH}"
        try:
            async with asyncio.timeout(DIAL_TIMEOUT):
                websocket = await self._http.ws_connect(
                    url,
                    ssl=self._context,
                    max_msg_size=self._limits.message_limit,
                    compress=0,
                    autoping=True,
                    heartbeat=None,
                    headers={"X-Tunnel-Replica": self._tls.name},
                )
                answered = self._tls.peer_of(websocket.get_extra_info("ssl_object"))
                if answered != owner.replica:
                    await websocket.close()
                    raise LinkError(
                        f"{owner.address} is replica {answered}, not {owner.replica}: "
                        "the database's record is stale"
                    )
                session = Session(
                    WebSocketTransport(websocket),
                    Connection(
                        Side.CLIENT,
                        self._limits,
                        keepalive=self._keepalive,
                        info={kinds.INFO_SERVER_VERSION: __version__},
                        stream_kinds=(),
                    ),
                    label=f"link={owner.replica}",
                )
                task = asyncio.create_task(session.run(), name=f"link {owner.replica}")
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                await session.wait_ready()
        except (TimeoutError, aiohttp.ClientError, OSError, SessionClosedError) as exc:
            raise LinkError(
                f"cannot reach server replica {owner.replica} at {owner.address}: "
                f"{exc or type(exc).__name__}"
            ) from exc
        self.dialed += 1
        logger.info("linked to replica %s at %s", owner.replica, owner.address)
        return session


_REGISTRY: web.AppKey[AgentRegistry] = web.AppKey("registry", AgentRegistry)
_TLS: web.AppKey[ReplicaTls] = web.AppKey("replica_tls", ReplicaTls)


class _Accepted:
    """The links other replicas opened to this one."""

    def __init__(self) -> None:
        self.sessions: set[Session] = set()


_LINKS: web.AppKey[_Accepted] = web.AppKey("links", _Accepted)
_SETTINGS: web.AppKey[tuple[Limits, Keepalive]] = web.AppKey("link_settings", tuple)


def peer_app(
    registry: AgentRegistry, tls: ReplicaTls, limits: Limits, keepalive: Keepalive
) -> web.Application:
    """The internal port's application: links from other replicas, nothing else."""
    app = web.Application()
    app[_REGISTRY] = registry
    app[_TLS] = tls
    app[_LINKS] = _Accepted()
    app[_SETTINGS] = (link_limits(limits), keepalive)
    app.router.add_get(LINK_PATH, _accept_link)
    app.on_shutdown.append(_close_links)
    return app


async def _accept_link(request: web.Request) -> web.StreamResponse:
    tls = request.app[_TLS]
    try:
        transport = request.transport
        peer = tls.peer_of(transport.get_extra_info("ssl_object") if transport else None)
    except LinkError as exc:
        raise web.HTTPForbidden(text=str(exc)) from exc
    limits, keepalive = request.app[_SETTINGS]
    websocket = web.WebSocketResponse(
        max_msg_size=limits.message_limit, compress=False, autoping=True, heartbeat=None
    )
    await websocket.prepare(request)
    registry = request.app[_REGISTRY]

    async def on_stream(stream: MuxStream) -> None:
        await relay_forwarded(registry, tls.name, stream)

    session = Session(
        WebSocketTransport(websocket),
        Connection(
            Side.SERVER,
            limits,
            keepalive=keepalive,
            info={kinds.INFO_SERVER_VERSION: __version__},
            stream_kinds={kinds.STREAM_HTTP},
        ),
        handlers=SessionHandlers(on_stream=on_stream),
        label=f"link-from={peer}",
    )
    links = request.app[_LINKS].sessions
    links.add(session)
    logger.info("replica %s linked", peer)
    try:
        await session.run()
    finally:
        links.discard(session)
    return websocket


async def _close_links(app: web.Application) -> None:
    for session in list(app[_LINKS].sessions):
        await session.close()
