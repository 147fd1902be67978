"""What another replica changed, applied here as soon as the database announces it.

The database announces each change that other replicas must act on
(``tunnel_server.store.replicas.StoreEvent``); this replica applies them in
order, in one task of its own:

- a user, token or grant changed: the cached access is forgotten and the
  requests in progress here that it no longer allows end (within a second of
  the change, wherever it was made);
- a cluster's certificates were revoked, or the cluster deleted: its agent's
  session, if held here, is closed;
- a command was submitted, requeued or cancelled: the dispatch here, if this
  replica holds the cluster's agent, delivers or cancels it; followers of the
  command wake;
- a session was claimed: an older one held here is closed (fenced);
- ``resync`` (the announcements were interrupted): everything cached is
  checked again.

A flood of announcements beyond :data:`MAX_QUEUED` is not queued: it becomes
one ``resync``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from tunnel_server.access.cache import AccessCache
from tunnel_server.agents.registry import AgentRegistry
from tunnel_server.commands.dispatcher import CommandDispatcher
from tunnel_server.proxy.live_requests import LiveRequests
from tunnel_server.replicas.membership import Membership
from tunnel_server.store.base import Store, StoreError
from tunnel_server.store.replicas import ReplicaStore, StoreEvent

__all__ = ["MAX_QUEUED", "ChangeFollower"]

logger = logging.getLogger(__name__)

#: Announcements waiting to be applied, at most.
MAX_QUEUED = 10_000

#: Why a session is closed when its cluster's certificates were revoked elsewhere.
REVOKED = "the cluster's certificates were revoked"
#: Why a session is closed when its cluster was deleted elsewhere.
DELETED = "the cluster was deleted"


class ChangeFollower:
    """Applies the changes the database announces to this replica's parts."""

    def __init__(
        self,
        store: Store,
        membership: Membership,
        registry: AgentRegistry,
        access: AccessCache,
        live: LiveRequests,
        commands: CommandDispatcher,
        revoked: set[int],
    ) -> None:
        self._store = store
        self._membership = membership
        self._registry = registry
        self._access = access
        self._live = live
        self._commands = commands
        #: The server's set of revoked serials (ServerContext.revoked), kept current.
        self._revoked = revoked
        self._queue: asyncio.Queue[StoreEvent] = asyncio.Queue()
        self._overflowed = False
        #: Announcements applied (for tests and metrics).
        self.applied = 0

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Hear and apply changes while the block runs (nothing on SQLite)."""
        store = self._store
        if not isinstance(store, ReplicaStore):
            yield
            return
        worker = asyncio.create_task(self._apply_forever(), name="replica changes")
        try:
            async with store.listen(self.heard):
                yield
        finally:
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)

    def heard(self, event: StoreEvent) -> None:
        """Queue an announcement (called by the store's listener; never blocks)."""
        if self._queue.qsize() >= MAX_QUEUED:
            if not self._overflowed:
                self._overflowed = True
                logger.warning("more than %d changes queued: checking everything", MAX_QUEUED)
            return
        self._queue.put_nowait(event)

    async def _apply_forever(self) -> None:
        while True:
            event = await self._queue.get()
            if self._overflowed and self._queue.empty():
                self._overflowed = False
                event = StoreEvent("resync")
            try:
                await self.apply(event)
            except StoreError as exc:
                logger.warning("could not apply a %s change: %s", event.kind, exc)
            except Exception:
                logger.exception("applying a %s change failed", event.kind)
            self.applied += 1

    async def apply(self, event: StoreEvent) -> None:
        """Act on one announcement."""
        kind = event.kind
        cluster = event.cluster
        if kind == "access":
            await self._live.access_changed(user=event.user, cluster=cluster)
        elif kind == "session":
            await self._membership.session_claimed(event)
        elif kind == "command" and cluster is not None and event.command is not None:
            await self._commands.heard_change(cluster, event.command, event.state, event.cancel)
        elif kind == "revoked" and cluster is not None:
            self._revoked |= await self._store.revoked_serials()
            agent = self._registry.get(cluster)
            if agent is not None and agent.serial in self._revoked:
                await self._registry.disconnect(cluster, REVOKED)
        elif kind == "cluster" and cluster is not None:
            await self._registry.disconnect(cluster, DELETED)
        elif kind == "resync":
            await self._resync()

    async def _resync(self) -> None:
        self._membership.resync()
        self._revoked |= await self._store.revoked_serials()
        for cluster, agent in self._registry.connected().items():
            if agent.serial in self._revoked:
                await self._registry.disconnect(cluster, REVOKED)
            else:
                self._commands.kick(cluster)
        await self._live.access_changed()
