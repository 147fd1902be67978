"""OpenTofu state kept in the agent's namespace is named for its submitter.

The agent keeps that state as itself (only the run's own Secret and lock), so
two submitters naming the same ``secretSuffix`` must get two states: neither
can read, lock or overwrite the other's by naming it.
"""

from __future__ import annotations

from tunnel_agent.executors.tofu import scoped_backend
from tunnel_agent.identity import AGENT, RunIdentity
from tunnel_commands import KubernetesBackend, TofuSpec
from tunnel_commands.sources import GitSource

SOURCE = GitSource("https://git.example/infra.git", "main")
OWN = "tunnel-agent"


def spec(backend: KubernetesBackend) -> TofuSpec:
    return TofuSpec(SOURCE, backend)


def suffix_of(scoped: TofuSpec) -> str:
    assert isinstance(scoped.backend, KubernetesBackend)
    return scoped.backend.secret_suffix


def test_two_submitters_naming_one_suffix_get_two_states() -> None:
    alice = RunIdentity("tunnel:alice", ("tunnel:ops",))
    bob = RunIdentity("tunnel:bob", ("tunnel:ops",))
    named = spec(KubernetesBackend("web-app"))
    mine, theirs = (
        suffix_of(scoped_backend(named, OWN, alice)),
        suffix_of(scoped_backend(named, OWN, bob)),
    )
    assert mine != theirs
    assert mine.endswith("-web-app")
    assert theirs.endswith("-web-app")
    # The same submitter finds the same state again (groups do not change it).
    again = RunIdentity("tunnel:alice", ("tunnel:other",))
    assert suffix_of(scoped_backend(named, OWN, again)) == mine


def test_the_scoped_suffix_stays_a_label_value() -> None:
    long = spec(KubernetesBackend("x" * 63))
    suffix = suffix_of(scoped_backend(long, OWN, RunIdentity("tunnel:alice")))
    assert len(suffix) <= 63
    assert suffix[-1].isalnum()


def test_state_as_the_agent_or_in_a_namespace_of_the_submitters_is_left_as_written() -> None:
    named = spec(KubernetesBackend("web-app"))
    assert scoped_backend(named, OWN, AGENT) is named
    elsewhere = spec(KubernetesBackend("web-app", namespace="infra"))
    # There the submitter's own RBAC guards the Secret: nothing is kept as the agent.
    assert scoped_backend(elsewhere, OWN, RunIdentity("tunnel:alice")) is elsewhere
