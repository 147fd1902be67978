"""The fleet as the console shows it: one row per cluster a user may see.

What a row says comes from what the server knows already: the store's record
of each cluster and its agent (connected or not, since when, agent version,
policy), the commands waiting and running per cluster (the store), and, for an
agent connected to *this* replica, its live session: round-trip time, open
streams, bytes per second and the time its writers waited for credit
(:class:`TrafficSampler`). An agent connected to another replica shows as
connected, without those figures: only that replica holds its session.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tunnel_server import __version__
from tunnel_server.agents.registry import AgentConnection
from tunnel_server.clock import utcnow
from tunnel_server.context import ServerContext
from tunnel_server.store.base import Cluster

__all__ = ["SORT_KEYS", "FleetRow", "TrafficSampler", "filter_rows", "fleet_rows", "sort_rows"]


@dataclass(frozen=True, slots=True)
class _Sample:
    at: float
    #: Bytes sent and received so far, per cluster's session.
    totals: dict[str, tuple[int, int]]


class TrafficSampler:
    """Bytes per second of each local agent session, from its counters a second apart.

    Shared by every viewer: a look at the sessions is taken at most once per
    ``spacing`` seconds, however many pages ask.
    """

    def __init__(self, spacing: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._spacing = spacing
        self._clock = clock
        self._last: _Sample | None = None
        self._rates: dict[str, float] = {}

    def rates(self, agents: dict[str, AgentConnection]) -> dict[str, float]:
        """Bytes per second (both ways) of each connected cluster's session, where known."""
        now = self._clock()
        last = self._last
        if last is not None and now - last.at < self._spacing:
            return self._rates
        totals = {}
        for name, agent in agents.items():
            stats = agent.session.connection.stats
            totals[name] = (id(agent.session), stats.bytes_sent + stats.bytes_received)
        rates: dict[str, float] = {}
        if last is not None:
            elapsed = now - last.at
            for name, (session, total) in totals.items():
                before = last.totals.get(name)
                if before is not None and before[0] == session and elapsed > 0:
                    rates[name] = max(0.0, (total - before[1]) / elapsed)
        self._last = _Sample(now, totals)
        self._rates = rates
        return rates


@dataclass(frozen=True, slots=True)
class FleetRow:
    """One cluster on the fleet page; None where a figure is not known here."""

    name: str
    connected: bool
    #: Connected to this replica (the live figures below are known only then).
    local: bool
    #: Connected since, or (offline) last heard from.
    since: datetime | None
    agent_version: str | None
    outdated: bool
    rbac: str
    namespaces: tuple[str, ...]
    rtt_ms: float | None
    streams: int | None
    bytes_per_second: float | None
    credit_wait_seconds: float | None
    pending: int
    running: int

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "connected": self.connected,
            "local": self.local,
            "since": None if self.since is None else self.since.isoformat(),
            "agent_version": self.agent_version,
            "outdated": self.outdated,
            "rbac": self.rbac,
            "namespaces": list(self.namespaces),
            "rtt_ms": None if self.rtt_ms is None else round(self.rtt_ms, 1),
            "streams": self.streams,
            "bytes_per_second": (
                None if self.bytes_per_second is None else round(self.bytes_per_second)
            ),
            "credit_wait_seconds": (
                None if self.credit_wait_seconds is None else round(self.credit_wait_seconds, 1)
            ),
            "pending": self.pending,
            "running": self.running,
        }


def _row(
    cluster: Cluster,
    agent: AgentConnection | None,
    rates: dict[str, float],
    counts: dict[str, int],
) -> FleetRow:
    pending = counts.get("pending", 0)
    running = counts.get("running", 0) + counts.get("delivered", 0)
    if agent is None:
        # Another replica may hold its session: the store says so, without the figures.
        connected = cluster.connected_since is not None
        version = cluster.agent_version
        return FleetRow(
            name=cluster.name,
            connected=connected,
            local=False,
            since=cluster.connected_since if connected else cluster.last_seen,
            agent_version=version,
            outdated=version not in (None, __version__),
            rbac=cluster.rbac,
            namespaces=cluster.namespaces,
            rtt_ms=None,
            streams=None,
            bytes_per_second=None,
            credit_wait_seconds=None,
            pending=pending,
            running=running,
        )
    session = agent.session
    rtt = session.connection.rtt
    return FleetRow(
        name=cluster.name,
        connected=True,
        local=True,
        since=agent.connected_since,
        agent_version=agent.agent_version,
        outdated=agent.agent_version not in (None, __version__),
        rbac=cluster.rbac,
        namespaces=cluster.namespaces,
        rtt_ms=None if rtt is None else rtt * 1000,
        streams=session.streams,
        bytes_per_second=rates.get(cluster.name),
        credit_wait_seconds=session.flow_wait_seconds,
        pending=pending,
        running=running,
    )


async def fleet_rows(
    context: ServerContext, sampler: TrafficSampler, clusters: Iterable[Cluster]
) -> list[FleetRow]:
    """The rows of ``clusters``: the caller chose those its viewer may see
    (:func:`~tunnel_server.console.visibility.visible_clusters`)."""
    agents = context.registry.connected()
    rates = sampler.rates(agents)
    counts = await context.store.active_command_counts()
    return [
        _row(cluster, agents.get(cluster.name), rates, counts.get(cluster.name, {}))
        for cluster in clusters
    ]


#: What the fleet may be sorted by (the JSON field of each row).
SORT_KEYS = (
    "name",
    "connected",
    "since",
    "agent_version",
    "rtt_ms",
    "streams",
    "bytes_per_second",
    "credit_wait_seconds",
    "pending",
    "running",
)


def filter_rows(rows: list[FleetRow], text: str, state: str) -> list[FleetRow]:
    """The rows whose name contains ``text`` and whose state is ``state``
    (``connected``, ``disconnected``, ``outdated``; empty: any)."""
    text = text.strip().lower()
    kept = []
    for row in rows:
        if text and text not in row.name:
            continue
        if state == "connected" and not row.connected:
            continue
        if state == "disconnected" and row.connected:
            continue
        if state == "outdated" and not row.outdated:
            continue
        kept.append(row)
    return kept


def sort_rows(rows: list[FleetRow], key: str, descending: bool) -> list[FleetRow]:
    """``rows`` sorted by ``key`` (one of :data:`SORT_KEYS`), unknown figures last."""
    if key not in SORT_KEYS:
        key = "name"

    def sort_key(row: FleetRow) -> tuple[bool, Any, str]:
        value = getattr(row, key)
        if isinstance(value, datetime):
            value = value.timestamp()
        return (value is None, value if value is not None else 0, row.name)

    known = [row for row in rows if getattr(row, key) is not None]
    unknown = [row for row in rows if getattr(row, key) is None]
    known.sort(key=sort_key, reverse=descending)
    unknown.sort(key=lambda row: row.name)
    return known + unknown


def age(value: datetime | None) -> str:
    """``value`` as an age: "3m 2s", "2h 5m", "4d 1h"; "" when unknown."""
    if value is None:
        return ""
    seconds = max(0, int((utcnow() - value).total_seconds()))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"
