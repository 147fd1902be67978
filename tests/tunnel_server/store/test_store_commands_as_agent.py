"""A grant keeps whether its user's commands act as the agent (both engines)."""

from __future__ import annotations

from datetime import UTC, datetime

from tunnel_server.store import Grant, Store

NOW = datetime(2026, 1, 1, tzinfo=UTC)


async def test_a_grant_keeps_commands_as_agent_and_loses_it_when_replaced(store: Store) -> None:
    await store.add_user("ann", (), False, NOW)
    await store.add_cluster("prod", NOW)
    grant = Grant("ann", "prod", ("ops",), commands=True, commands_as_agent=True)
    await store.set_grant(grant)
    assert await store.get_grant("ann", "prod") == grant
    assert (await store.list_grants(user="ann"))[0].commands_as_agent is True
    await store.set_grant(Grant("ann", "prod", ("ops",), commands=True))
    assert (await store.get_grant("ann", "prod")).commands_as_agent is False


async def test_a_grant_made_before_the_column_acts_as_its_user(store: Store) -> None:
    await store.add_user("bob", (), False, NOW)
    await store.add_cluster("dev", NOW)
    await store.set_grant(Grant("bob", "dev", commands=True))
    assert (await store.get_grant("bob", "dev")).commands_as_agent is False
