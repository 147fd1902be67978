"""Replicas on one PostgreSQL database: who holds each session, fencing, notifications."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from tunnel_server.store.base import Grant
from tunnel_server.store.postgres import PostgresStore
from tunnel_server.store.replicas import StoreEvent

NOW = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)
LEASE = timedelta(seconds=10)


@pytest.fixture
async def store(postgres_url: str) -> AsyncIterator[PostgresStore]:
    opened = await PostgresStore.open(postgres_url)
    try:
        for name in ("alpha", "beta"):
            await opened.add_cluster(name, NOW)
        await opened.join_replica("a", "10.0.0.1:8443", "1.0", NOW, NOW + LEASE)
        await opened.join_replica("b", "10.0.0.2:8443", "1.0", NOW, NOW + LEASE)
        yield opened
    finally:
        await opened.close()


async def test_a_newer_claim_takes_the_session_with_a_greater_epoch(store: PostgresStore) -> None:
    first, before = await store.claim_session("alpha", "a", NOW, NOW + LEASE)
    second, previous = await store.claim_session("alpha", "b", NOW, NOW + LEASE)
    assert before is None
    assert previous == "a"
    assert second > first
    owner = await store.session_owner("alpha", NOW)
    assert owner is not None
    assert (owner.replica, owner.address, owner.epoch) == ("b", "10.0.0.2:8443", second)


async def test_renewal_reports_the_sessions_another_replica_took(store: PostgresStore) -> None:
    alpha, _ = await store.claim_session("alpha", "a", NOW, NOW + LEASE)
    beta, _ = await store.claim_session("beta", "a", NOW, NOW + LEASE)
    await store.claim_session("beta", "b", NOW, NOW + LEASE)
    later = NOW + timedelta(seconds=5)
    held = {"alpha": alpha, "beta": beta}
    fenced = await store.renew_sessions("a", held, 2, later, later + LEASE)
    assert fenced == {"beta"}
    owner = await store.session_owner("alpha", NOW + timedelta(seconds=12))
    assert owner is not None
    assert owner.lease_until == later + LEASE
    replicas = {replica.name: replica for replica in await store.list_replicas()}
    assert replicas["a"].agents == 2
    assert replicas["a"].heartbeat_at == later


async def test_a_session_whose_lease_ran_out_has_no_owner(store: PostgresStore) -> None:
    await store.claim_session("alpha", "a", NOW, NOW + LEASE)
    assert await store.session_owner("alpha", NOW + LEASE + timedelta(seconds=1)) is None
    assert await store.session_owners(NOW + LEASE + timedelta(seconds=1)) == {}


async def test_release_only_forgets_the_session_it_names(store: PostgresStore) -> None:
    old, _ = await store.claim_session("alpha", "a", NOW, NOW + LEASE)
    new, _ = await store.claim_session("alpha", "b", NOW, NOW + LEASE)
    assert not await store.release_session("alpha", "a", old)
    assert (await store.session_owners(NOW))["alpha"].epoch == new
    assert await store.release_session("alpha", "b", new)
    assert await store.session_owner("alpha", NOW) is None


async def test_a_draining_replica_is_no_owner_and_leaving_releases_all(
    store: PostgresStore,
) -> None:
    await store.claim_session("alpha", "a", NOW, NOW + LEASE)
    await store.claim_session("beta", "a", NOW, NOW + LEASE)
    await store.mark_draining("a")
    assert await store.session_owners(NOW) == {}
    await store.leave_replica("a")
    assert [replica.name for replica in await store.list_replicas()] == ["b"]


async def test_a_restarted_replica_forgets_what_its_earlier_process_held(
    store: PostgresStore,
) -> None:
    await store.claim_session("alpha", "a", NOW, NOW + LEASE)
    assert await store.join_replica("a", "10.0.0.9:8443", "1.1", NOW, NOW + LEASE) == 1
    assert await store.session_owner("alpha", NOW) is None


async def test_changes_are_announced_to_every_listener(store: PostgresStore) -> None:
    heard: asyncio.Queue[StoreEvent] = asyncio.Queue()
    async with store.listen(heard.put_nowait):
        assert (await heard.get()).kind == "resync"
        await store.add_user("eve", (), False, NOW)
        await store.set_grant(Grant("eve", "alpha", (), False, False))
        assert await heard.get() == StoreEvent("access", cluster="alpha", user="eve")
        epoch, _ = await store.claim_session("alpha", "b", NOW, NOW + LEASE)
        assert await heard.get() == StoreEvent("session", cluster="alpha", replica="b", epoch=epoch)
        await store.delete_user("eve")
        kinds = {(await heard.get()).kind, (await heard.get()).kind}
        assert kinds == {"access"}  # the grant's cascade, and the user
        await store.revoke_cluster_certificates("alpha", NOW)  # none issued: no event
        await store.delete_cluster("beta", NOW)
        assert await heard.get() == StoreEvent("cluster", cluster="beta")
