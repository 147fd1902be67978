"""What every request handler of the server shares, under one app key.

A plain container: the server's parts (store, registry, access cache, live
requests, audit writer, command dispatcher, metrics) are built by
:mod:`tunnel_server.app` and handed to the handlers in one
:class:`ServerContext`. None of those parts imports this module; the
handlers (the edge, the proxy, the APIs) do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web

from tunnel_server.access.cache import AccessCache
from tunnel_server.agents.registry import AgentRegistry
from tunnel_server.audit import AuditWriter
from tunnel_server.clock import utcnow
from tunnel_server.config import ServerSettings
from tunnel_server.metrics import ServerMetrics
from tunnel_server.proxy.live_requests import LiveRequests
from tunnel_server.statedir import ServerIdentity
from tunnel_server.store.base import Store

if TYPE_CHECKING:
    from tunnel_server.commands.dispatcher import CommandDispatcher
    from tunnel_server.replicas.links import PeerLinks
    from tunnel_server.replicas.membership import Membership

__all__ = ["CONTEXT", "ServerContext"]


@dataclass(slots=True)
class ServerContext:
    settings: ServerSettings
    identity: ServerIdentity
    store: Store
    registry: AgentRegistry
    access: AccessCache
    #: The proxied requests in progress, ended when access no longer allows them.
    live: LiveRequests
    audit: AuditWriter
    commands: CommandDispatcher
    metrics: ServerMetrics
    #: This replica among those sharing the database (alone on SQLite).
    replicas: Membership
    #: Links to the other replicas (None on SQLite, or before the internal port listens).
    links: PeerLinks | None = None
    #: Serials of revoked client certificates, loaded at start, kept current.
    revoked: set[int] = field(default_factory=set)

    async def revoke_cluster(self, cluster: str) -> int:
        """Revoke every certificate of ``cluster``, in the store and in :attr:`revoked`;
        return how many the store revoked."""
        count = await self.store.revoke_cluster_certificates(cluster, utcnow())
        self.revoked |= await self.store.revoked_serials()
        return count


CONTEXT: web.AppKey[ServerContext] = web.AppKey("context", ServerContext)
