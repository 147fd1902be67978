"""Whom a command acts as, as the server tells the agent in each offer."""

from __future__ import annotations

from datetime import UTC, datetime

from tunnel_server.commands.specs import command_identity
from tunnel_server.store.base import Grant, User

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_a_command_acts_as_its_submitter_in_the_users_and_the_grants_groups() -> None:
    alice = User("alice", ("dev", "ops"), False, NOW)
    grant = Grant("alice", "prod", as_groups=("ops", "viewers"), commands=True)
    assert command_identity(alice, grant) == {
        "user": "tunnel:alice",
        "groups": ["tunnel:dev", "tunnel:ops", "tunnel:viewers"],
    }


def test_an_admin_without_a_grant_acts_as_the_admin() -> None:
    admin = User("admin", (), True, NOW)
    assert command_identity(admin, None) == {"user": "tunnel:admin", "groups": []}


def test_a_grant_made_commands_as_agent_acts_as_the_agent() -> None:
    bob = User("bob", ("dev",), False, NOW)
    grant = Grant("bob", "prod", commands=True, commands_as_agent=True)
    assert command_identity(bob, grant) == {"agent": True}
    admin = User("root", (), True, NOW)
    assert command_identity(admin, Grant("root", "prod", commands_as_agent=True)) == {"agent": True}
