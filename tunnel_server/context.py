"""What every request handler of the server shares, under one app key."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from aiohttp import web

from .access import AccessCache
from .audit import AuditWriter
from .config import ServerSettings
from .live_requests import LiveRequests
from .metrics import ServerMetrics
from .registry import AgentRegistry
from .statedir import ServerIdentity
from .store.base import Store

if TYPE_CHECKING:
    from .commands.dispatcher import CommandDispatcher

__all__ = ["CONTEXT", "ServerContext", "utcnow"]


def utcnow() -> datetime:
    return datetime.now(UTC)


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
    #: Serials of revoked client certificates, loaded at start, kept current.
    revoked: set[int] = field(default_factory=set)

    async def revoke_cluster(self, cluster: str) -> int:
        """Revoke every certificate of ``cluster``, in the store and in :attr:`revoked`;
        return how many the store revoked."""
        count = await self.store.revoke_cluster_certificates(cluster, utcnow())
        self.revoked |= await self.store.revoked_serials()
        return count


CONTEXT: web.AppKey[ServerContext] = web.AppKey("context", ServerContext)
