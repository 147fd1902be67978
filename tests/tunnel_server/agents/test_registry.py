"""How long a cluster's agent has been gone, which decides whether a 503 asks for a retry;
and when a new connection may take over the live one."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import cast

import pytest

from tunnel_mux import Session
from tunnel_server.agents.registry import AgentConnection, AgentRegistry
from tunnel_server.agents.takeovers import TakeoverPolicy
from tunnel_server.proxy.refusal import RECONNECT_EXPECTED, offline_refusal


@dataclass
class FakeSession:
    is_open: bool = True

    async def close(self, code: int = 0, reason: str = "") -> None:
        self.is_open = False

    async def shutdown(self, grace: float) -> None:
        self.is_open = False


def connection(cluster: str = "prod-eu", remote: str = "10.0.0.1") -> AgentConnection:
    return AgentConnection(
        cluster, cast(Session, FakeSession()), 1, "0.1.0", remote, datetime.now(UTC)
    )


def test_a_cluster_never_seen_has_no_time_offline() -> None:
    assert AgentRegistry(replace_grace=1.0).offline_for("prod-eu") is None


def test_an_agent_that_left_has_been_offline_since_it_left() -> None:
    registry = AgentRegistry(replace_grace=1.0)
    agent = connection()
    registry.attach(agent)
    assert registry.offline_for("prod-eu") is None  # connected
    before = time.monotonic()
    registry.detach(agent)
    offline = registry.offline_for("prod-eu")
    assert offline is not None
    assert 0.0 <= offline <= time.monotonic() - before
    registry.attach(connection())
    assert registry.offline_for("prod-eu") is None  # back


def test_an_ended_session_not_yet_detached_counts_as_just_left() -> None:
    registry = AgentRegistry(replace_grace=1.0)
    agent = connection()
    registry.attach(agent)
    cast(FakeSession, agent.session).is_open = False
    assert registry.get("prod-eu") is None
    assert registry.offline_for("prod-eu") == 0.0


async def test_an_agent_this_server_dropped_is_not_expected_back() -> None:
    registry = AgentRegistry(replace_grace=1.0)
    agent = connection()
    registry.attach(agent)
    registry.detach(agent)
    registry.attach(agent := connection())
    assert await registry.disconnect("prod-eu", "the cluster was revoked")
    registry.detach(agent)
    assert registry.offline_for("prod-eu") is None


@pytest.mark.parametrize(
    ("offline_for", "retry", "message"),
    [
        (None, False, "cluster c is not connected (its agent is offline)"),
        (
            0.4,
            True,
            "cluster c is not connected (its agent left 0s ago and is expected back shortly)",
        ),
        (RECONNECT_EXPECTED - 0.1, True, "(its agent left 9s ago and is expected back shortly)"),
        (RECONNECT_EXPECTED, False, "cluster c is not connected (its agent is offline for 10s)"),
        (59 * 60 + 59, False, "(its agent is offline for 59m)"),
        (3 * 3600 + 5 * 60 + 7, False, "(its agent is offline for 3h 5m)"),
        (2 * 86400 + 4 * 3600, False, "(its agent is offline for 2d 4h)"),
    ],
)
def test_only_an_agent_that_left_moments_ago_is_worth_a_retry(
    offline_for: float | None, retry: bool, message: str
) -> None:
    refusal = offline_refusal("c", offline_for)
    assert (refusal.code, refusal.reason, refusal.retry) == (503, "ServiceUnavailable", retry)
    assert refusal.message.endswith(message)


async def test_connections_from_two_addresses_replacing_each_other_are_stopped() -> None:
    registry = AgentRegistry(replace_grace=0.0)
    registry.attach(connection(remote="10.0.0.1"))
    for remote in ("10.0.0.2", "10.0.0.1"):
        assert registry.admit("prod-eu", remote) is None
        registry.attach(connection(remote=remote))
    serving = registry.get("prod-eu")
    refusal = registry.admit("prod-eu", "10.0.0.2")
    assert refusal is not None
    assert refusal.reason == "flapping"
    assert (refusal.serving, refusal.newcomer) == ("10.0.0.1", "10.0.0.2")
    assert registry.get("prod-eu") is serving
    await registry.close(grace=0)


async def test_a_newcomer_is_never_refused_when_no_connection_is_live() -> None:
    """The one refused may be the real agent: once the other is gone, it comes back."""
    registry = AgentRegistry(replace_grace=0.0, takeovers=TakeoverPolicy(limit=2))
    registry.attach(first := connection(remote="10.0.0.1"))
    assert registry.admit("prod-eu", "10.0.0.2") is None
    registry.attach(connection(remote="10.0.0.2"))
    assert registry.admit("prod-eu", "10.0.0.1") is not None  # flapping (limit 2)
    registry.detach(first)
    serving = registry.get("prod-eu")
    assert serving is not None
    registry.detach(serving)
    assert registry.admit("prod-eu", "10.0.0.1") is None
    await registry.close(grace=0)


async def test_a_revoked_cluster_starts_afresh() -> None:
    registry = AgentRegistry(replace_grace=0.0, takeovers=TakeoverPolicy(limit=2))
    registry.attach(connection(remote="10.0.0.1"))
    assert registry.admit("prod-eu", "10.0.0.2") is None
    registry.attach(connection(remote="10.0.0.2"))
    assert registry.admit("prod-eu", "10.0.0.1") is not None
    await registry.disconnect("prod-eu", "the cluster's certificates were revoked")
    registry.attach(connection(remote="10.0.0.3"))  # reinstalled, with a new certificate
    assert registry.admit("prod-eu", "10.0.0.4") is None
    await registry.close(grace=0)
