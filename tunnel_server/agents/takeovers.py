"""When a new agent connection may take over a cluster's live one: the flapping rule.

A cluster has one live session; a new connection of the same cluster takes
over at once (``registry``). That is right for an agent that restarts or
reconnects, but two agents holding one key (a copied credentials Secret, a
stolen key) then replace each other about once a second, each takeover
cutting the requests in flight. This module decides, without I/O and with the
time passed in, when that is what is happening and what to refuse.

The rule, per cluster, over takeovers *from another address* (a newcomer
whose source address differs from the live connection's):

- ``limit`` (3) such takeovers within ``window`` (60 s), among which an
  address comes back (fewer distinct addresses than the takeovers' ends: one
  that was replaced has taken over again), is flapping. The newcomer that
  would make it so is refused, and the cluster's back-off starts.
- For ``refuse_for`` (10 minutes) after that, a newcomer from another address
  than the live connection's is refused. The connection serving keeps serving.

What never counts: a newcomer when no connection is live (the caller does not
ask), one from the live connection's own address (an agent whose old link died
without a word reconnects), one whose address or the live one's is unknown,
and a chain of new addresses (a pod rescheduled to one node, then another:
A→B, B→C). A single agent cannot flap: it dials again only after its own
session ended, and a session that ends unseen by the server takes the keepalive
(30 s) to notice, so one agent makes at most two takeovers a minute.

Agents behind one address (one NAT, a TCP proxy that hides agents' addresses)
look like one agent here: two of them sharing a key are not told apart.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["TakeoverPolicy", "TakeoverRefusal"]

#: Why a takeover was refused: it made the flapping, or came during the back-off.
RefusalReason = Literal["flapping", "backoff"]

#: Takeovers kept per cluster: enough to judge any window (a flap is found by the third).
_HISTORY = 32


@dataclass(frozen=True, slots=True)
class TakeoverRefusal:
    """A newcomer refused: why, when to try again, and what was seen."""

    reason: RefusalReason
    #: Seconds until the cluster's back-off ends.
    retry_after: float
    #: The source address of the refused newcomer, and of the connection serving.
    newcomer: str
    serving: str
    #: Takeovers from another address within the window, the refused one included
    #: (for ``backoff``: those that started it).
    takeovers: int
    #: The addresses involved, in the order first seen.
    sources: tuple[str, ...]
    #: The window the takeovers were counted in, in seconds.
    window: float


@dataclass(slots=True)
class _Cluster:
    #: (time, from address, to address) of recent takeovers from another address.
    takeovers: deque[tuple[float, str, str]] = field(default_factory=lambda: deque(maxlen=_HISTORY))
    #: Until when newcomers from another address are refused, and what started it.
    refused_until: float = 0.0
    found: tuple[int, tuple[str, ...]] = (0, ())


class TakeoverPolicy:
    """Decides, per cluster, whether a newcomer may take over the live connection."""

    def __init__(self, *, window: float = 60.0, limit: int = 3, refuse_for: float = 600.0) -> None:
        if window <= 0 or refuse_for <= 0 or limit < 2:
            raise ValueError("window and refuse_for must be positive, limit at least 2")
        self.window = window
        self.limit = limit
        self.refuse_for = refuse_for
        self._clusters: dict[str, _Cluster] = {}

    def takeover(
        self, cluster: str, serving: str | None, newcomer: str | None, now: float
    ) -> TakeoverRefusal | None:
        """A newcomer from ``newcomer`` would replace ``cluster``'s live connection, whose
        address is ``serving``: None to let it (and count it), else why not.

        Call only while the cluster has a live connection; ``now`` is monotonic seconds.
        """
        if serving is None or newcomer is None or serving == newcomer:
            return None
        state = self._clusters.get(cluster)
        if state is None:
            state = self._clusters[cluster] = _Cluster()
        recent = state.takeovers
        while recent and recent[0][0] <= now - self.window:
            recent.popleft()
        if now < state.refused_until:
            takeovers, sources = state.found
            return TakeoverRefusal(
                "backoff",
                state.refused_until - now,
                newcomer,
                serving,
                takeovers,
                sources,
                self.window,
            )
        seen = [*recent, (now, serving, newcomer)]
        sources = tuple(dict.fromkeys(address for _, *ends in seen for address in ends))
        # A chain of n takeovers has n + 1 ends: fewer distinct addresses means one came back.
        if len(seen) >= self.limit and len(sources) <= len(seen):
            recent.clear()
            state.refused_until = now + self.refuse_for
            state.found = (len(seen), sources)
            return TakeoverRefusal(
                "flapping",
                self.refuse_for,
                newcomer,
                serving,
                len(seen),
                sources,
                self.window,
            )
        recent.append((now, serving, newcomer))
        return None

    def forget(self, cluster: str) -> None:
        """Drop what is known of ``cluster`` (its certificates were revoked: a new start)."""
        self._clusters.pop(cluster, None)

    def clusters(self) -> set[str]:
        """The clusters something is remembered of (takeovers, a back-off)."""
        return set(self._clusters)

    def sweep(self, now: float) -> None:
        """Drop the clusters with nothing left to remember at ``now`` (bounds the memory)."""
        for cluster, state in list(self._clusters.items()):
            recent = state.takeovers
            if now >= state.refused_until and (not recent or recent[-1][0] <= now - self.window):
                del self._clusters[cluster]
