"""The proxy's request metrics: as prometheus_client's own counter and histogram would read."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from tunnel_server.metrics import KNOWN_VERBS, ProxyRequestCollector, ServerMetrics

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 60)


def exposition(registry: CollectorRegistry) -> list[str]:
    """The scraped lines, without the creation times only prometheus_client's own types add."""
    text = generate_latest(registry).decode()
    return sorted(line for line in text.splitlines() if "_created" not in line)


def test_the_counts_and_durations_read_as_prometheus_client_s_would() -> None:
    ours = CollectorRegistry()
    ours.register(collector := ProxyRequestCollector(BUCKETS))
    theirs = CollectorRegistry()
    counts = Counter(
        "tunnel_server_proxy_requests",
        "Proxied Kubernetes API requests, by verb and status.",
        ["verb", "code"],
        registry=theirs,
    )
    durations = Histogram(
        "tunnel_server_proxy_request_duration_seconds",
        "Duration of proxied requests (whole response, so watches are long).",
        ["verb"],
        buckets=BUCKETS,
        registry=theirs,
    )
    rng = random.Random(7)
    seconds = [*BUCKETS, 0.0, 61.0, *(rng.expovariate(20) for _ in range(500))]  # bounds: le
    for value in seconds:
        verb = rng.choice(["get", "list", "watch", "exec", "PROPFIND"])
        code = rng.choice([200, 201, 404, 503])
        collector.observe(verb, code, value)
        verb = verb if verb in KNOWN_VERBS else "other"
        counts.labels(verb, str(code)).inc()
        durations.labels(verb).observe(value)

    assert exposition(ours) == exposition(theirs)


def test_the_server_s_metrics_count_proxied_requests() -> None:
    metrics = ServerMetrics()
    metrics.observe_proxy("get", 200, 0.002)
    metrics.observe_proxy("get", 200, 0.5)

    text = metrics.render().decode()

    assert 'tunnel_server_proxy_requests_total{code="200",verb="get"} 2.0' in text
    assert 'tunnel_server_proxy_request_duration_seconds_bucket{le="0.0025",verb="get"} 1.0' in text
    assert 'tunnel_server_proxy_request_duration_seconds_count{verb="get"} 2.0' in text
