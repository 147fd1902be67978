"""The agent's Prometheus metrics, served at /metrics on its health port.

Read at scrape time from the counts the agent, its proxy and its command
runner keep; labels are bounded (verbs, status codes, types, outcomes).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tunnel_mux.metrics import SessionCollector

from .connector import Agent
from .kubeproxy import KubeProxy
from .runner import CommandRunner

__all__ = ["AgentMetrics"]

_VERBS = frozenset({"get", "head", "post", "put", "patch", "delete", "options"})


class _AgentCollector(Collector):
    def __init__(self, agent: Agent, proxy: KubeProxy | None, runner: CommandRunner | None) -> None:
        self._agent = agent
        self._proxy = proxy
        self._runner = runner

    def collect(self) -> Iterator[Metric]:
        agent = self._agent
        yield GaugeMetricFamily(
            "tunnel_agent_connected",
            "1 while connected to the server.",
            value=1 if agent.connected.is_set() else 0,
        )
        yield CounterMetricFamily(
            "tunnel_agent_connections", "Sessions established.", value=agent.connections
        )
        yield CounterMetricFamily(
            "tunnel_agent_reconnect_failures",
            "Connection attempts that failed.",
            value=agent.failed_attempts,
        )
        yield CounterMetricFamily("tunnel_agent_bootstraps", "Bootstraps.", value=agent.bootstraps)
        yield CounterMetricFamily(
            "tunnel_agent_certificate_renewals", "Renewals.", value=agent.renewals
        )
        if self._proxy is not None:
            requests = CounterMetricFamily(
                "tunnel_agent_proxy_requests",
                "Requests relayed to the API server, by method and status.",
                labels=["method", "code"],
            )
            for (method, code), count in sorted(self._proxy.requests.items()):
                requests.add_metric([method if method in _VERBS else "other", str(code)], count)
            yield requests
            yield CounterMetricFamily(
                "tunnel_agent_policy_refusals",
                "Requests the agent's policy refused.",
                value=self._proxy.refusals,
            )
        if self._runner is not None:
            commands = CounterMetricFamily(
                "tunnel_agent_commands",
                "Commands finished, by type and outcome.",
                labels=["type", "outcome"],
            )
            for (kind, outcome), count in sorted(self._runner.finished.items()):
                commands.add_metric([kind, outcome], count)
            yield commands
            yield GaugeMetricFamily(
                "tunnel_agent_commands_active",
                "Commands queued or running.",
                value=sum(1 for job in self._runner.jobs.values() if job.state != "finished"),
            )


class AgentMetrics:
    """The agent's registry; ``retire`` each session as it ends."""

    def __init__(
        self,
        agent: Agent,
        proxy: KubeProxy | None = None,
        runner: CommandRunner | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        self.sessions = SessionCollector(
            "tunnel_agent", lambda: [agent.session] if agent.session is not None else []
        )
        self.registry.register(self.sessions)
        self.registry.register(_AgentCollector(agent, proxy, runner))

    def render(self) -> bytes:
        return generate_latest(self.registry)
