"""Which agent session serves which cluster, right now.

One live session per cluster: a new connection from the same cluster takes
over at once, and the one it replaces gets GOAWAY and a grace period for its
open streams, unless connections from different addresses keep replacing each
other (two agents with one key: ``takeovers``), when the newcomer is refused
before its upgrade (:meth:`AgentRegistry.admit`). The registry owns the
retiring tasks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import datetime

from protocol import ErrorCode
from tunnel_mux import Session
from tunnel_server.agents.takeovers import TakeoverPolicy, TakeoverRefusal

__all__ = ["AgentConnection", "AgentRegistry"]

logger = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class AgentConnection:
    """One connected agent: its session and what it said about itself."""

    cluster: str
    session: Session
    serial: int
    agent_version: str | None
    remote_addr: str | None
    connected_since: datetime
    #: The session's epoch among the replicas sharing a database: a newer session
    #: of the cluster, wherever it is, has a greater one (tunnel_server/replicas).
    epoch: int = 0
    #: What the agent said of its cluster and itself (claims, bounded and printable).
    kubernetes_version: str | None = None
    pod: str | None = None
    #: Closed because a newer session of the cluster holds it elsewhere (fenced).
    fenced: bool = False


class AgentRegistry:
    """The live agent connection of each cluster."""

    def __init__(self, replace_grace: float, takeovers: TakeoverPolicy | None = None) -> None:
        self._agents: dict[str, AgentConnection] = {}
        #: When each cluster's agent left (time.monotonic), until it is back.
        #: Not for a cluster whose agent this server dropped (revoked, deleted).
        self._left: dict[str, float] = {}
        self._replace_grace = replace_grace
        self._retiring: set[asyncio.Task[None]] = set()
        self._takeovers = takeovers or TakeoverPolicy()

    def get(self, cluster: str) -> AgentConnection | None:
        """The cluster's live connection, if its agent is connected."""
        agent = self._agents.get(cluster)
        if agent is not None and not agent.session.is_open:
            return None
        return agent

    def offline_for(self, cluster: str) -> float | None:
        """Seconds since the cluster's agent left; None if it has not been here since
        this server started, or this server dropped it (revoked, deleted)."""
        agent = self._agents.get(cluster)
        if agent is not None:
            return 0.0 if not agent.session.is_open else None  # ended, not yet detached
        left = self._left.get(cluster)
        return None if left is None else time.monotonic() - left

    def connected(self) -> dict[str, AgentConnection]:
        return {name: agent for name, agent in self._agents.items() if agent.session.is_open}

    def admit(self, cluster: str, remote: str | None) -> TakeoverRefusal | None:
        """Whether a new connection of ``cluster`` from ``remote`` may come (None), or why
        not: connections from different addresses keep replacing each other.

        Asked before the WebSocket upgrade; a newcomer admitted while a connection
        is live counts as a takeover from that moment.
        """
        now = time.monotonic()
        self._takeovers.sweep(now)
        serving = self.get(cluster)
        if serving is None:
            return None  # nothing to take over: never refused, whatever came before
        return self._takeovers.takeover(cluster, serving.remote_addr, remote, now)

    def attach(self, agent: AgentConnection) -> None:
        """Make ``agent`` the cluster's connection; retire the one it replaces."""
        old = self._agents.get(agent.cluster)
        self._agents[agent.cluster] = agent
        self._left.pop(agent.cluster, None)
        if old is not None and old is not agent:
            logger.info(
                "a new agent connection from %s replaces the one from %s",
                agent.remote_addr,
                old.remote_addr,
                extra={"cluster": agent.cluster},
            )
            self._retire(old, self._replace_grace)

    def detach(self, agent: AgentConnection) -> None:
        """Forget ``agent`` if it is still the cluster's connection."""
        if self._agents.get(agent.cluster) is agent:
            del self._agents[agent.cluster]
            self._left[agent.cluster] = time.monotonic()

    async def disconnect(self, cluster: str, reason: str) -> bool:
        """Drop the cluster's connection now (revocation). True if there was one."""
        self._left.pop(cluster, None)  # not expected back
        self._takeovers.forget(cluster)  # a reinstalled agent starts afresh
        agent = self._agents.pop(cluster, None)
        if agent is None:
            return False
        await agent.session.close(ErrorCode.NO_ERROR, reason)
        return True

    async def fence(self, cluster: str, newer: int, reason: str) -> bool:
        """Close the cluster's session if its epoch is older than ``newer`` (a newer
        session holds the cluster on another replica); whether it did."""
        agent = self._agents.get(cluster)
        if agent is None or agent.epoch >= newer:
            return False
        del self._agents[cluster]
        agent.fenced = True
        logger.info("closing the session: %s", reason, extra={"cluster": cluster})
        await agent.session.close(ErrorCode.NO_ERROR, reason)
        return True

    async def close(self, grace: float) -> None:
        """Shut every session down: GOAWAY, ``grace`` seconds for open streams, close."""
        agents = list(self._agents.values())
        self._agents.clear()
        for agent in agents:
            self._retire(agent, grace)
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)

    def _retire(self, agent: AgentConnection, grace: float) -> None:
        task = asyncio.create_task(agent.session.shutdown(grace), name=f"retire {agent.cluster}")
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)
