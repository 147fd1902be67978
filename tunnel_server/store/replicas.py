"""What replicas sharing one database know of each other: the engine-neutral part.

Several ``tunnel-server`` replicas on one PostgreSQL database record there
which replica holds each cluster's agent session (:class:`SessionOwner`), and
each replica's own heartbeat (:class:`ReplicaRecord`). A store that can be
shared implements :class:`ReplicaStore` beside :class:`~tunnel_server.store.base.Store`;
SQLite, one replica's embedded file, does not.

Fencing (docs/operations.md, "Several replicas"): every claim of a cluster
takes a new epoch from one sequence, so the newest session is the one the
database names; a replica renews the leases of the sessions it holds on each
heartbeat and learns in the same statement which of them another replica
has taken since.

Changes other replicas must hear of at once reach them as :class:`StoreEvent`
notifications, sent by the database itself when the rows change (triggers),
whatever changed them.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

__all__ = [
    "EVENT_KINDS",
    "ReplicaRecord",
    "ReplicaStore",
    "SessionOwner",
    "StoreEvent",
]


@dataclass(frozen=True, slots=True)
class SessionOwner:
    """The replica that holds a cluster's agent session, per the database."""

    cluster: str
    replica: str
    #: ``host:port`` where other replicas reach it (its internal address).
    address: str
    epoch: int
    lease_until: datetime


@dataclass(frozen=True, slots=True)
class ReplicaRecord:
    """One replica as it last reported itself."""

    name: str
    address: str
    version: str
    started_at: datetime
    heartbeat_at: datetime
    lease_until: datetime
    #: Agent sessions it held at its last heartbeat.
    agents: int
    draining: bool

    def alive(self, now: datetime) -> bool:
        """Whether its lease still runs (it renewed in time)."""
        return self.lease_until > now and not self.draining


#: The kinds of :class:`StoreEvent` the database sends.
EVENT_KINDS = frozenset(
    {
        "access",  # a user, an API token or a grant changed: user, cluster (or None)
        "revoked",  # a cluster's certificates were revoked: cluster
        "cluster",  # a cluster was deleted: cluster
        "command",  # a command became pending, or changed: cluster, id, state
        "session",  # a cluster's session was claimed: cluster, replica, epoch
        "resync",  # not from the database: the listener (re)connected, events may be lost
    }
)


@dataclass(frozen=True, slots=True)
class StoreEvent:
    """A change another replica may have made, as the database announced it."""

    kind: str
    cluster: str | None = None
    user: str | None = None
    replica: str | None = None
    epoch: int | None = None
    command: str | None = None
    state: str | None = None
    #: A command's cancellation was asked for.
    cancel: bool = False

    @classmethod
    def from_payload(cls, payload: Mapping[str, object]) -> StoreEvent | None:
        """The event a notification's JSON object describes; None if it is not one."""
        kind = payload.get("kind")
        if not isinstance(kind, str) or kind not in EVENT_KINDS:
            return None

        def text(key: str) -> str | None:
            value = payload.get(key)
            return value if isinstance(value, str) else None

        epoch = payload.get("epoch")
        return cls(
            kind=kind,
            cluster=text("cluster"),
            user=text("user"),
            replica=text("replica"),
            epoch=epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None,
            command=text("id"),
            state=text("state"),
            cancel=payload.get("cancel") is True,
        )


class ReplicaStore(abc.ABC):
    """The part of a shared store that coordinates replicas (PostgreSQL)."""

    @abc.abstractmethod
    async def join_replica(
        self, name: str, address: str, version: str, now: datetime, lease_until: datetime
    ) -> int:
        """Record this replica as started, and forget sessions an earlier process of the
        same name left; how many it forgot."""

    @abc.abstractmethod
    async def leave_replica(self, name: str) -> None:
        """Record the replica as gone, releasing every session it held (a graceful stop)."""

    @abc.abstractmethod
    async def mark_draining(self, name: str) -> None:
        """Record that the replica takes no new agents (it is stopping)."""

    @abc.abstractmethod
    async def claim_session(
        self, cluster: str, replica: str, now: datetime, lease_until: datetime
    ) -> tuple[int, str | None]:
        """Make ``replica`` the holder of ``cluster``'s session with a new epoch, whoever
        held it; the epoch and the replica that held it before (None: none)."""

    @abc.abstractmethod
    async def release_session(self, cluster: str, replica: str, epoch: int) -> bool:
        """Forget the session if it is still ``replica``'s at ``epoch``; whether it was."""

    @abc.abstractmethod
    async def renew_sessions(
        self,
        replica: str,
        epochs: Mapping[str, int],
        agents: int,
        now: datetime,
        lease_until: datetime,
    ) -> set[str]:
        """Renew the replica's heartbeat and the leases of the sessions it holds
        (``epochs``: cluster to epoch); the clusters among them whose session the
        database no longer names as this one's (fenced by a newer session)."""

    @abc.abstractmethod
    async def session_owner(self, cluster: str, now: datetime) -> SessionOwner | None:
        """The replica holding ``cluster``'s session with a lease that still runs."""

    @abc.abstractmethod
    async def session_owners(self, now: datetime) -> dict[str, SessionOwner]:
        """Every session whose lease still runs, by cluster."""

    @abc.abstractmethod
    async def list_replicas(self) -> list[ReplicaRecord]:
        """Every replica that has reported itself, the most recent first."""

    @abc.abstractmethod
    def listen(
        self, on_event: Callable[[StoreEvent], None]
    ) -> contextlib.AbstractAsyncContextManager[None]:
        """Call ``on_event`` for each change the database announces while the block runs.

        Kept up on a connection of its own, reconnected after a failure with a
        ``resync`` event (what was announced meanwhile is lost).
        """
