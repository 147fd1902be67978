"""This replica among those that share a PostgreSQL database: the sessions it holds.

Each agent session a replica accepts is claimed in the database with a new
epoch (:meth:`Membership.claim`); the newest claim of a cluster is the one
that serves it, wherever it is. The replica's heartbeat renews the leases of
the sessions it holds and learns in the same statement which of them a newer
session elsewhere has taken (fenced: closed here). A replica that cannot
renew for a whole lease stops serving the sessions it holds, so that their
agents move to a replica that can, rather than serve an ownership the others
may no longer see (docs/operations.md, "Several replicas").

A request for a cluster held elsewhere asks :meth:`Membership.owner` where
to forward it; the answer is remembered for a moment and forgotten as soon as
the database announces a new claim of that cluster.

A server on SQLite is a replica alone (no :class:`ReplicaStore`): its claims
only number its sessions, and no cluster has an owner elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from datetime import timedelta

from tunnel_server import __version__
from tunnel_server.agents.registry import AgentRegistry
from tunnel_server.clock import utcnow
from tunnel_server.config import ReplicaSettings
from tunnel_server.store.base import StoreError
from tunnel_server.store.replicas import ReplicaRecord, ReplicaStore, SessionOwner, StoreEvent

__all__ = ["OWNER_MEMORY", "Membership"]

logger = logging.getLogger(__name__)

#: Seconds an owner looked up (or its absence) is remembered, unless a claim is heard.
OWNER_MEMORY = 1.0
#: The most owners remembered at once.
MAX_REMEMBERED = 20_000

#: Why a session is closed when another replica holds a newer one.
FENCED = "a newer session of this cluster is held by another server replica"
#: Why sessions are closed when the replica cannot renew its hold.
LEASE_LOST = "this server replica cannot renew its hold on its sessions in the database"


class Membership:
    """Claims, renews and gives up this replica's agent sessions; finds other owners."""

    def __init__(
        self,
        settings: ReplicaSettings,
        store: ReplicaStore | None,
        registry: AgentRegistry,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.name = settings.name
        self.store = store
        self.registry = registry
        self.clock = clock
        #: ``host:port`` of this replica's internal port, once it listens.
        self.address: str | None = None
        #: Why the replica does not hold its sessions now (its lease ran out), if so.
        self.lease_lost: str | None = None
        #: Whether the replica is stopping (it takes no new agents or requests).
        self.draining = False
        self._local_epochs = itertools.count(1)
        self._renewed_at = clock()
        self._owners: dict[str, tuple[float, SessionOwner | None]] = {}
        self._heartbeat: asyncio.Task[None] | None = None
        #: The audit records' ``replicas`` text, by the replica that served.
        self._records: dict[str, str] = {}

    @property
    def shared(self) -> bool:
        """Whether other replicas may share the database."""
        return self.store is not None

    @contextlib.asynccontextmanager
    async def running(self, address: str) -> AsyncIterator[None]:
        """Join the replicas at ``address`` and keep the heartbeat while the block runs;
        leave them (releasing every session) after it."""
        store = self.store
        if store is None:
            yield
            return
        self.address = address
        now = utcnow()
        forgotten = await store.join_replica(
            self.name, address, __version__, now, now + self._lease()
        )
        if forgotten:
            logger.info("forgot %d sessions an earlier process of %s held", forgotten, self.name)
        self._renewed_at = self.clock()
        logger.info("replica %s joined; other replicas reach it at %s", self.name, address)
        self._heartbeat = asyncio.create_task(self._beat_forever(), name="replica heartbeat")
        try:
            yield
        finally:
            self._heartbeat.cancel()
            await asyncio.gather(self._heartbeat, return_exceptions=True)
            try:
                await store.leave_replica(self.name)
            except StoreError as exc:
                logger.warning("could not record that replica %s left: %s", self.name, exc)

    async def drain(self) -> None:
        """Take no new agents: other replicas stop forwarding here (a stopping replica)."""
        self.draining = True
        if self.store is not None:
            try:
                await self.store.mark_draining(self.name)
            except StoreError as exc:
                logger.warning("could not record that replica %s drains: %s", self.name, exc)

    # ------------------------------------------------------------- sessions

    async def claim(self, cluster: str) -> int:
        """Make this replica the holder of ``cluster``'s session; its epoch.

        Raises :class:`StoreError` when the database cannot record it: the
        session must then not serve.
        """
        store = self.store
        if store is None:
            return next(self._local_epochs)
        if self.lease_lost is not None:
            raise StoreError(self.lease_lost)
        now = utcnow()
        epoch, previous = await store.claim_session(cluster, self.name, now, now + self._lease())
        self._owners.pop(cluster, None)
        if previous is not None and previous != self.name:
            logger.info(
                "took the session over from replica %s (epoch %d)",
                previous,
                epoch,
                extra={"cluster": cluster},
            )
        return epoch

    async def release(self, cluster: str, epoch: int) -> None:
        """Give up the session of ``cluster`` at ``epoch`` (its agent left), if still held."""
        if self.store is None:
            return
        try:
            await self.store.release_session(cluster, self.name, epoch)
        except StoreError as exc:
            # Its lease runs out on its own: no heartbeat renews a session no longer here.
            logger.warning("could not release the session: %s", exc, extra={"cluster": cluster})

    async def owner(self, cluster: str) -> SessionOwner | None:
        """The other replica that holds ``cluster``'s session, if any.

        Raises :class:`StoreError` when the database cannot say.
        """
        store = self.store
        if store is None:
            return None
        now = self.clock()
        remembered = self._owners.get(cluster)
        if remembered is not None and remembered[0] > now:
            return remembered[1]
        owner = await store.session_owner(cluster, utcnow())
        if owner is not None and owner.replica == self.name:
            owner = None  # a session this replica no longer has: its lease runs out
        if len(self._owners) >= MAX_REMEMBERED:
            self._owners.clear()
        self._owners[cluster] = (now + OWNER_MEMORY, owner)
        return owner

    def record_of(self, served_by: str) -> str:
        """The audit record's ``replicas`` for a request this replica received and
        ``served_by`` served (empty: this one); empty on a replica alone."""
        if self.store is None:
            return ""
        served = served_by or self.name
        if served not in self._records:
            self._records[served] = json.dumps({"received": self.name, "served": served})
        return self._records[served]

    def forget_owner(self, cluster: str) -> None:
        """Ask the database again next time (the owner named did not serve)."""
        self._owners.pop(cluster, None)

    async def replicas(self) -> list[ReplicaRecord]:
        """Every replica that reported itself; just this one on SQLite."""
        if self.store is None:
            now = utcnow()
            return [
                ReplicaRecord(
                    name=self.name,
                    address=self.address or "",
                    version=__version__,
                    started_at=now,
                    heartbeat_at=now,
                    lease_until=now,
                    agents=len(self.registry.connected()),
                    draining=False,
                )
            ]
        return await self.store.list_replicas()

    async def owners(self) -> dict[str, SessionOwner]:
        """Every live session's holder, by cluster (empty on SQLite)."""
        return {} if self.store is None else await self.store.session_owners(utcnow())

    # ------------------------------------------------------------ heartbeat

    async def _beat_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.heartbeat)
            try:
                await self.beat()
            except Exception:
                logger.exception("replica heartbeat failed")

    async def beat(self) -> None:
        """Renew this replica's sessions; close those a newer session took, or all of
        them when the hold could not be renewed for a whole lease."""
        store = self.store
        if store is None:
            return
        held = {cluster: agent.epoch for cluster, agent in self.registry.connected().items()}
        now = utcnow()
        try:
            fenced = await store.renew_sessions(
                self.name, held, len(held), now, now + self._lease()
            )
        except StoreError as exc:
            silent = self.clock() - self._renewed_at
            if silent >= self.settings.lease and self.lease_lost is None:
                await self._lose_hold(f"{LEASE_LOST} ({exc})")
            return
        self._renewed_at = self.clock()
        if self.lease_lost is not None:
            logger.info("replica %s holds its sessions in the database again", self.name)
            self.lease_lost = None
        for cluster in fenced:
            await self.registry.fence(cluster, held[cluster] + 1, FENCED)

    async def _lose_hold(self, reason: str) -> None:
        self.lease_lost = reason
        connected = self.registry.connected()
        logger.error("%s: closing its %d agent sessions so they move", reason, len(connected))
        for cluster, agent in connected.items():
            await self.registry.fence(cluster, agent.epoch + 1, LEASE_LOST)

    # --------------------------------------------------------------- events

    async def session_claimed(self, event: StoreEvent) -> None:
        """A replica claimed a cluster's session: a newer one than this replica's is
        closed here, and where the cluster is served is asked again."""
        cluster = event.cluster
        if cluster is None or event.epoch is None:
            return
        self._owners.pop(cluster, None)
        if event.replica != self.name:
            await self.registry.fence(cluster, event.epoch, FENCED)

    def resync(self) -> None:
        """Notifications may have been lost: forget every owner remembered."""
        self._owners.clear()

    def _lease(self) -> timedelta:
        return timedelta(seconds=self.settings.lease)
