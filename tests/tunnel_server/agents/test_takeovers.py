"""When a new agent connection may take over a cluster's live one (the flapping rule).

Pure: the policy is fed addresses and times, and says whom to refuse.
"""

from __future__ import annotations

from typing import Any

import pytest

from tunnel_server.agents.takeovers import TakeoverPolicy

A, B, C, D = "10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"


def policy() -> TakeoverPolicy:
    return TakeoverPolicy(window=60.0, limit=3, refuse_for=600.0)


def test_two_addresses_replacing_each_other_are_refused_at_the_third_takeover() -> None:
    takeovers = policy()
    assert takeovers.takeover("prod", A, B, now=0.0) is None
    assert takeovers.takeover("prod", B, A, now=1.0) is None
    refusal = takeovers.takeover("prod", A, B, now=2.0)
    assert refusal is not None
    assert refusal.reason == "flapping"
    assert (refusal.newcomer, refusal.serving) == (B, A)
    assert refusal.takeovers == 3
    assert refusal.sources == (A, B)
    assert refusal.retry_after == 600.0
    assert refusal.window == 60.0


def test_after_the_flap_a_newcomer_from_another_address_is_refused_until_the_back_off_ends() -> (
    None
):
    takeovers = policy()
    for now, (serving, newcomer) in enumerate([(A, B), (B, A), (A, B)]):
        takeovers.takeover("prod", serving, newcomer, now=float(now))
    later = takeovers.takeover("prod", A, B, now=302.0)
    assert later is not None
    assert later.reason == "backoff"
    assert later.retry_after == pytest.approx(300.0)
    assert (later.takeovers, later.sources) == (3, (A, B))
    # Any other address too: the connection serving keeps serving.
    assert takeovers.takeover("prod", A, C, now=303.0) is not None
    # Once the back-off is over, a takeover is let through (and counted afresh).
    assert takeovers.takeover("prod", A, B, now=602.0) is None


def test_during_the_back_off_the_live_connections_own_address_may_reconnect() -> None:
    """An agent whose old link died unseen dials again from where it is: not a takeover."""
    takeovers = policy()
    for now, (serving, newcomer) in enumerate([(A, B), (B, A), (A, B)]):
        takeovers.takeover("prod", serving, newcomer, now=float(now))
    assert takeovers.takeover("prod", A, A, now=10.0) is None


def test_an_agent_that_reconnects_from_its_own_address_is_never_refused() -> None:
    takeovers = policy()
    for second in range(100):
        assert takeovers.takeover("prod", A, A, now=float(second)) is None


def test_a_pod_rescheduled_to_another_node_takes_over_once() -> None:
    takeovers = policy()
    assert takeovers.takeover("prod", A, B, now=0.0) is None
    assert takeovers.takeover("prod", B, B, now=1.0) is None  # and reconnects from there


def test_a_chain_of_new_addresses_is_no_flap() -> None:
    """Rescheduled again and again (A, then B, C, D): no address comes back."""
    takeovers = policy()
    assert takeovers.takeover("prod", A, B, now=0.0) is None
    assert takeovers.takeover("prod", B, C, now=1.0) is None
    assert takeovers.takeover("prod", C, D, now=2.0) is None


def test_a_thief_dialling_from_new_addresses_is_found_when_the_real_agent_returns() -> None:
    takeovers = policy()
    assert takeovers.takeover("prod", A, B, now=0.0) is None
    assert takeovers.takeover("prod", B, A, now=1.0) is None
    refusal = takeovers.takeover("prod", A, C, now=2.0)
    assert refusal is not None
    assert refusal.reason == "flapping"
    assert refusal.sources == (A, B, C)


def test_takeovers_spread_beyond_the_window_are_no_flap() -> None:
    takeovers = policy()
    assert takeovers.takeover("prod", A, B, now=0.0) is None
    assert takeovers.takeover("prod", B, A, now=40.0) is None
    assert takeovers.takeover("prod", A, B, now=80.0) is None  # the first has left the window
    assert takeovers.takeover("prod", B, A, now=125.0) is None  # and the second
    refusal = takeovers.takeover("prod", A, B, now=130.0)  # three within 60 s: 80, 125, 130
    assert refusal is not None
    assert refusal.reason == "flapping"


def test_an_unknown_address_is_never_judged() -> None:
    takeovers = policy()
    for second in range(10):
        assert takeovers.takeover("prod", None, A, now=float(second)) is None
        assert takeovers.takeover("prod", A, None, now=float(second) + 0.5) is None


def test_clusters_are_judged_apart() -> None:
    takeovers = policy()
    takeovers.takeover("prod", A, B, now=0.0)
    takeovers.takeover("prod", B, A, now=1.0)
    assert takeovers.takeover("staging", A, B, now=2.0) is None
    assert takeovers.takeover("prod", A, B, now=3.0) is not None


def test_a_forgotten_cluster_starts_afresh() -> None:
    """After a revocation, the reinstalled agent is not held to what the old key did."""
    takeovers = policy()
    for now, (serving, newcomer) in enumerate([(A, B), (B, A), (A, B)]):
        takeovers.takeover("prod", serving, newcomer, now=float(now))
    takeovers.forget("prod")
    assert takeovers.takeover("prod", A, C, now=10.0) is None


def test_a_sweep_keeps_what_still_matters_and_drops_the_rest() -> None:
    takeovers = policy()
    takeovers.takeover("calm", A, B, now=0.0)
    for now, (serving, newcomer) in enumerate([(A, B), (B, A), (A, B)]):
        takeovers.takeover("prod", serving, newcomer, now=float(now))
    takeovers.sweep(now=61.0)
    # The back-off outlives the sweep; the calm cluster's one takeover does not.
    assert takeovers.clusters() == {"prod"}
    takeovers.sweep(now=603.0)
    assert takeovers.clusters() == set()


@pytest.mark.parametrize(
    "options",
    [{"window": 0.0}, {"refuse_for": -1.0}, {"limit": 1}],
)
def test_limits_that_cannot_work_are_refused(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="window"):
        TakeoverPolicy(**options)
