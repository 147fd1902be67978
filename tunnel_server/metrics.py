"""The server's Prometheus metrics, served at /metrics.

Each app has its own registry (several servers can share a process, as in
tests). Labels are bounded: outcomes, verbs, status codes, stream kinds and
error-code names; never cluster names, users, paths or addresses.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from tunnel_mux import Session
from tunnel_mux.metrics import SessionCollector

__all__ = ["KNOWN_VERBS", "ServerMetrics"]

KNOWN_VERBS = frozenset(
    {
        "get",
        "list",
        "watch",
        "create",
        "update",
        "patch",
        "delete",
        "deletecollection",
        "head",
        "options",
        "post",
        "put",
        "exec",
        "attach",
        "portforward",
        "proxy",
    }
)
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 60)
_COMMAND_BUCKETS = (0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600)


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._live: set[Session] = set()
        # The labelled children of the proxy's metrics, found once: labels() costs
        # a lock and a lookup on every proxied request. Bounded by verbs x codes.
        self._proxy_counts: dict[tuple[str, int], Counter] = {}
        self._proxy_durations: dict[str, Histogram] = {}
        self.sessions = SessionCollector("tunnel_server", lambda: list(self._live))
        self.registry.register(self.sessions)
        r = self.registry
        self.bootstraps = Counter(
            "tunnel_server_bootstraps", "Bootstrap requests, by outcome.", ["outcome"], registry=r
        )
        self.agent_connects = Counter(
            "tunnel_server_agent_connects", "Agent sessions established.", registry=r
        )
        self.agent_refusals = Counter(
            "tunnel_server_agent_refusals",
            "Agent connections refused, by reason.",
            ["reason"],
            registry=r,
        )
        self.clusters_connected = Gauge(
            "tunnel_server_clusters_connected", "Clusters whose agent is connected.", registry=r
        )
        self.proxy_requests = Counter(
            "tunnel_server_proxy_requests",
            "Proxied Kubernetes API requests, by verb and status.",
            ["verb", "code"],
            registry=r,
        )
        self.proxy_duration = Histogram(
            "tunnel_server_proxy_request_duration_seconds",
            "Duration of proxied requests (whole response, so watches are long).",
            ["verb"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.commands_submitted = Counter(
            "tunnel_server_commands_submitted", "Commands submitted, by type.", ["type"], registry=r
        )
        self.commands_finished = Counter(
            "tunnel_server_commands_finished",
            "Commands finished, by type and outcome.",
            ["type", "outcome"],
            registry=r,
        )
        self.command_duration = Histogram(
            "tunnel_server_command_duration_seconds",
            "From submission to the final state, by type.",
            ["type"],
            buckets=_COMMAND_BUCKETS,
            registry=r,
        )

    def track(self, session: Session) -> None:
        self._live.add(session)

    def untrack(self, session: Session) -> None:
        if session in self._live:
            self._live.discard(session)
            self.sessions.retire(session)

    def observe_proxy(self, verb: str, code: int, seconds: float) -> None:
        verb = verb if verb in KNOWN_VERBS else "other"
        count = self._proxy_counts.get((verb, code))
        if count is None:
            count = self._proxy_counts[verb, code] = self.proxy_requests.labels(verb, str(code))
        count.inc()
        duration = self._proxy_durations.get(verb)
        if duration is None:
            duration = self._proxy_durations[verb] = self.proxy_duration.labels(verb)
        duration.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
