"""The server's Prometheus metrics, served at /metrics.

Each app has its own registry (several servers can share a process, as in
tests). Labels are bounded: outcomes, verbs, status codes, stream kinds and
error-code names; never cluster names, users, paths or addresses.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from tunnel_mux import Session
from tunnel_mux.metrics import SessionCollector
from tunnel_server.edge.callerlimit import CallerConnections
from tunnel_server.edge.handshakes import HandshakeAdmission

__all__ = [
    "KNOWN_VERBS",
    "CallerConnectionCollector",
    "HandshakeCollector",
    "ProxyRequestCollector",
    "ServerMetrics",
]

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


class ProxyRequestCollector(Collector):
    """Proxied requests by verb and code, and their durations by verb.

    Counted in plain numbers on the event loop, one request at a time (a
    Prometheus counter and histogram take a lock and a Python loop each, on
    every proxied request), and turned into metrics when scraped, on the same
    loop. Verbs outside :data:`KNOWN_VERBS` count as ``other``.
    """

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self._bounds = buckets
        self._counts: dict[tuple[str, int], int] = {}
        #: Per verb: observations per bucket (the last: above every bound), then the sum.
        self._durations: dict[str, tuple[list[int], list[float]]] = {}

    def observe(self, verb: str, code: int, seconds: float) -> None:
        if verb not in KNOWN_VERBS:
            verb = "other"
        counts = self._counts
        key = (verb, code)
        counts[key] = counts.get(key, 0) + 1
        duration = self._durations.get(verb)
        if duration is None:
            duration = self._durations[verb] = ([0] * (len(self._bounds) + 1), [0.0])
        duration[0][bisect.bisect_left(self._bounds, seconds)] += 1
        duration[1][0] += seconds

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "tunnel_server_proxy_requests",
            "Proxied Kubernetes API requests, by verb and status.",
            labels=["verb", "code"],
        )
        for (verb, code), count in sorted(self._counts.items()):
            requests.add_metric([verb, str(code)], count)
        yield requests
        durations = HistogramMetricFamily(
            "tunnel_server_proxy_request_duration_seconds",
            "Duration of proxied requests (whole response, so watches are long).",
            labels=["verb"],
        )
        bounds = [*map(floatToGoString, self._bounds), "+Inf"]
        for verb, (counts, total) in sorted(self._durations.items()):
            cumulative, running = [], 0
            for bound, count in zip(bounds, counts, strict=True):
                running += count
                cumulative.append((bound, float(running)))
            durations.add_metric([verb], cumulative, total[0])
        yield durations


class CallerConnectionCollector(Collector):
    """Callers' connections open, their bound, and those closed or refused at it."""

    def __init__(self, callers: CallerConnections) -> None:
        self._callers = callers

    def collect(self) -> Iterator[Metric]:
        callers = self._callers
        yield GaugeMetricFamily(
            "tunnel_server_caller_connections",
            "Connections callers (not agents) hold open.",
            value=callers.open,
        )
        yield GaugeMetricFamily(
            "tunnel_server_caller_connections_limit",
            "The most connections callers may hold open (--max-caller-connections).",
            value=callers.limit,
        )
        yield CounterMetricFamily(
            "tunnel_server_caller_connections_evicted",
            "Idle caller connections closed to make room for a new one, at the limit.",
            value=callers.evicted,
        )
        yield CounterMetricFamily(
            "tunnel_server_caller_connections_refused",
            "Caller connections answered 503 at the limit, every other one serving a request.",
            value=callers.refused,
        )
        yield GaugeMetricFamily(
            "tunnel_server_caller_connections_per_address_limit",
            "The most caller connections one address may hold open "
            "(--max-caller-connections-per-address).",
            value=callers.per_address,
        )
        yield CounterMetricFamily(
            "tunnel_server_caller_connections_refused_per_address",
            "Of those refused, the ones refused at their address's limit.",
            value=callers.refused_per_address,
        )


class HandshakeCollector(Collector):
    """Connections before and in their TLS handshake, and those let go on the way."""

    def __init__(self, admission: HandshakeAdmission[Any]) -> None:
        self._admission = admission

    def collect(self) -> Iterator[Metric]:
        admission = self._admission
        yield GaugeMetricFamily(
            "tunnel_server_tls_handshakes",
            "TLS handshakes in progress.",
            value=admission.in_progress,
        )
        yield GaugeMetricFamily(
            "tunnel_server_tls_handshakes_limit",
            "The most TLS handshakes in progress at once.",
            value=admission.handshakes,
        )
        waiting = GaugeMetricFamily(
            "tunnel_server_tls_connections_waiting",
            "Connections accepted whose TLS handshake has not started, by what they wait for.",
            labels=["for"],
        )
        waiting.add_metric(["client_hello"], admission.waiting)
        waiting.add_metric(["slot"], admission.queued)
        yield waiting
        dropped = CounterMetricFamily(
            "tunnel_server_tls_connections_dropped",
            "Connections closed before their TLS handshake was done, by why: no ClientHello "
            "or slot by the deadline, first bytes that are no ClientHello, room made for "
            "another, a stalled handshake abandoned for another address's.",
            labels=["reason"],
        )
        dropped.add_metric(["timeout"], admission.timed_out)
        dropped.add_metric(["not_tls"], admission.not_tls)
        dropped.add_metric(["room"], admission.closed_for_room)
        dropped.add_metric(["abandoned"], admission.abandoned)
        yield dropped


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._live: set[Session] = set()
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
        self.agent_takeovers_refused = Counter(
            "tunnel_server_agent_takeovers_refused",
            "Agent connections refused because connections of their cluster from different "
            "addresses kept replacing each other (two agents sharing one certificate), by "
            "reason: flapping (the refusal that found it, once per back-off) or backoff "
            "(refused while the cluster's back-off lasts).",
            ["reason"],
            registry=r,
        )
        for reason in ("flapping", "backoff"):
            # Present at zero from the start, so that an alert on increase() sees the first.
            self.agent_takeovers_refused.labels(reason)
        self.agent_timeouts = Counter(
            "tunnel_server_agent_timeouts",
            "Agent sessions dropped because the agent did not answer a PING in time "
            "(the keepalive's, or one sent with new work): links gone dead.",
            registry=r,
        )
        self.agent_protocol_errors = Counter(
            "tunnel_server_agent_protocol_errors",
            "Agent sessions this server ended because the agent broke the protocol, by the "
            "GOAWAY's code (EXCESSIVE_LOAD: more frames without data than allowed).",
            ["code"],
            registry=r,
        )
        self.tls_handshake_seconds = Histogram(
            "tunnel_server_tls_handshake_seconds",
            "TLS handshakes done, from the slot taken to the handshake's end: against the "
            "grace after which one may be abandoned for another address's connection (2 s).",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0),
            registry=r,
        )
        self.clusters_connected = Gauge(
            "tunnel_server_clusters_connected", "Clusters whose agent is connected.", registry=r
        )
        self.store_write_failing = Gauge(
            "tunnel_server_store_write_failing",
            "1 while the state database cannot be written (disk full, I/O error): audit events, "
            "commands and agents' connections are not recorded, and /readyz answers 503.",
            registry=r,
        )
        self.proxies = ProxyRequestCollector(_LATENCY_BUCKETS)
        r.register(self.proxies)
        self.proxy_in_progress = Gauge(
            "tunnel_server_proxy_requests_in_progress",
            "Proxied requests in progress (watches, exec and port-forwards included).",
            registry=r,
        )
        self.proxy_revoked = Counter(
            "tunnel_server_proxy_requests_revoked",
            "Proxied requests in progress ended because their caller's access was taken away.",
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

    def watch_callers(self, callers: CallerConnections) -> None:
        """Report ``callers``' connections (the front doors are made after the metrics)."""
        self.registry.register(CallerConnectionCollector(callers))

    def watch_handshakes(self, admission: HandshakeAdmission[Any]) -> None:
        """Report the TLS listener's admission (made with the listener, after the metrics)."""
        self.registry.register(HandshakeCollector(admission))

    def observe_proxy(self, verb: str, code: int, seconds: float) -> None:
        self.proxies.observe(verb, code, seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
