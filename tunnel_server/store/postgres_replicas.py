"""Replicas and the agent sessions they hold, as coroutines on a PostgreSQL connection.

``PostgresStore`` runs each with a connection of its pool (see
:class:`~tunnel_server.store.replicas.ReplicaStore` for what each means).
A claim is one statement: the row of the cluster takes the claimant's name
and a new epoch from ``agent_session_epochs`` whoever held it, and the
database's trigger announces it on commit (``postgres_schema``, migration 6),
so the replica that held it closes its session at once. Schema:
``postgres_schema``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from asyncpg import Record

from tunnel_server.store.postgres_codec import utc
from tunnel_server.store.postgres_schema import Connection
from tunnel_server.store.replicas import ReplicaRecord, SessionOwner

__all__ = [
    "claim_session",
    "join_replica",
    "leave_replica",
    "list_replicas",
    "mark_draining",
    "release_session",
    "renew_sessions",
    "session_owner",
    "session_owners",
]


async def join_replica(
    db: Connection, name: str, address: str, version: str, now: datetime, lease_until: datetime
) -> int:
    """See :meth:`ReplicaStore.join_replica`."""
    async with db.transaction():
        await db.execute(
            """
            INSERT INTO replicas
                (name, address, version, started_at, heartbeat_at, lease_until, agents, draining)
            VALUES ($1, $2, $3, $4, $4, $5, 0, false)
            ON CONFLICT (name) DO UPDATE SET
                address = EXCLUDED.address, version = EXCLUDED.version,
                started_at = EXCLUDED.started_at, heartbeat_at = EXCLUDED.heartbeat_at,
                lease_until = EXCLUDED.lease_until, agents = 0, draining = false
            """,
            name,
            address,
            version,
            now,
            lease_until,
        )
        status = await db.execute("DELETE FROM agent_sessions WHERE replica = $1", name)
    return int(status.split()[-1])


async def leave_replica(db: Connection, name: str) -> None:
    """See :meth:`ReplicaStore.leave_replica`."""
    async with db.transaction():
        await db.execute("DELETE FROM agent_sessions WHERE replica = $1", name)
        await db.execute("DELETE FROM replicas WHERE name = $1", name)


async def mark_draining(db: Connection, name: str) -> None:
    """See :meth:`ReplicaStore.mark_draining`."""
    await db.execute("UPDATE replicas SET draining = true WHERE name = $1", name)


async def claim_session(
    db: Connection, cluster: str, replica: str, now: datetime, lease_until: datetime
) -> tuple[int, str | None]:
    """See :meth:`ReplicaStore.claim_session`."""
    async with db.transaction():
        # The row is locked by the upsert below; read the holder under the same lock.
        previous = await db.fetchval(
            "SELECT replica FROM agent_sessions WHERE cluster = $1 FOR UPDATE", cluster
        )
        epoch = await db.fetchval(
            """
            INSERT INTO agent_sessions (cluster, replica, epoch, claimed_at, lease_until)
            VALUES ($1, $2, nextval('agent_session_epochs'), $3, $4)
            ON CONFLICT (cluster) DO UPDATE SET
                replica = EXCLUDED.replica, epoch = EXCLUDED.epoch,
                claimed_at = EXCLUDED.claimed_at, lease_until = EXCLUDED.lease_until
            RETURNING epoch
            """,
            cluster,
            replica,
            now,
            lease_until,
        )
    return int(epoch), previous


async def release_session(db: Connection, cluster: str, replica: str, epoch: int) -> bool:
    """See :meth:`ReplicaStore.release_session`."""
    status = await db.execute(
        "DELETE FROM agent_sessions WHERE cluster = $1 AND replica = $2 AND epoch = $3",
        cluster,
        replica,
        epoch,
    )
    return status.endswith(" 1")


async def renew_sessions(
    db: Connection,
    replica: str,
    epochs: Mapping[str, int],
    agents: int,
    now: datetime,
    lease_until: datetime,
) -> set[str]:
    """See :meth:`ReplicaStore.renew_sessions`."""
    clusters = list(epochs)
    async with db.transaction():
        await db.execute(
            "UPDATE replicas SET heartbeat_at = $2, lease_until = $3, agents = $4 WHERE name = $1",
            replica,
            now,
            lease_until,
            agents,
        )
        renewed = await db.fetch(
            """
            UPDATE agent_sessions AS s SET lease_until = $2
            FROM unnest($3::text[], $4::bigint[]) AS held (cluster, epoch)
            WHERE s.cluster = held.cluster AND s.epoch = held.epoch AND s.replica = $1
            RETURNING s.cluster
            """,
            replica,
            lease_until,
            clusters,
            [epochs[name] for name in clusters],
        )
    return set(clusters) - {row["cluster"] for row in renewed}


_OWNERS = """
    SELECT s.cluster, s.replica, r.address, s.epoch, s.lease_until
    FROM agent_sessions AS s JOIN replicas AS r ON r.name = s.replica
    WHERE s.lease_until > $1 AND NOT r.draining
"""


def _owner(row: Record) -> SessionOwner:
    return SessionOwner(
        cluster=row["cluster"],
        replica=row["replica"],
        address=row["address"],
        epoch=int(row["epoch"]),
        lease_until=utc(row["lease_until"]),
    )


async def session_owner(db: Connection, cluster: str, now: datetime) -> SessionOwner | None:
    """See :meth:`ReplicaStore.session_owner`."""
    row = await db.fetchrow(_OWNERS + " AND s.cluster = $2", now, cluster)
    return None if row is None else _owner(row)


async def session_owners(db: Connection, now: datetime) -> dict[str, SessionOwner]:
    """See :meth:`ReplicaStore.session_owners`."""
    return {row["cluster"]: _owner(row) for row in await db.fetch(_OWNERS, now)}


async def list_replicas(db: Connection) -> list[ReplicaRecord]:
    """See :meth:`ReplicaStore.list_replicas`."""
    rows = await db.fetch("SELECT * FROM replicas ORDER BY heartbeat_at DESC, name")
    return [
        ReplicaRecord(
            name=row["name"],
            address=row["address"],
            version=row["version"],
            started_at=utc(row["started_at"]),
            heartbeat_at=utc(row["heartbeat_at"]),
            lease_until=utc(row["lease_until"]),
            agents=row["agents"],
            draining=row["draining"],
        )
        for row in rows
    ]
