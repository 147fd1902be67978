"""How long a cluster's agent has been gone, which decides whether a 503 asks for a retry."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import cast

import pytest

from tunnel_mux import Session
from tunnel_server.agents.registry import AgentConnection, AgentRegistry
from tunnel_server.proxy.refusal import RECONNECT_EXPECTED, offline_refusal


@dataclass
class FakeSession:
    is_open: bool = True

    async def close(self, code: int = 0, reason: str = "") -> None:
        self.is_open = False


def connection(cluster: str = "prod-eu") -> AgentConnection:
    return AgentConnection(
        cluster, cast(Session, FakeSession()), 1, "0.1.0", "10.0.0.1", datetime.now(UTC)
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
