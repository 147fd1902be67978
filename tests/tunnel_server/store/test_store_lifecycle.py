"""A store's life on each engine: what it keeps across a reopening, and how it closes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.tunnel_server.store_engines import OpenStore
from tunnel_server.store import AuditEvent, Grant, Store, StoreClosedError, hash_token

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


async def test_data_survives_closing_and_reopening(open_store: OpenStore) -> None:
    store = await open_store()
    await store.add_cluster("prod", NOW, rbac="readonly", namespaces=("web", "jobs"))
    await store.record_connection("prod", "1.2.3", "10.0.0.1:4242", NOW, NOW)
    await store.add_bootstrap_token(hash_token("t"), "prod", NOW, NOW + timedelta(hours=1))
    await store.record_certificate(0xABC, "prod", "sha256:ab", NOW, NOW + timedelta(days=1))
    await store.add_user("ann", ("dev",), False, NOW)
    await store.add_api_token(hash_token("api"), "ann", NOW)
    await store.set_grant(Grant("ann", "prod", ("view",), commands=True))
    event = await store.add_audit(AuditEvent(None, NOW, "ann", "prod", "proxy", "get"))
    version = await store.schema_version()
    await store.close()

    reopened = await open_store()
    try:
        cluster = await reopened.get_cluster("prod")
        assert (cluster.rbac, cluster.agent_version, cluster.remote_addr) == (
            "readonly",
            "1.2.3",
            "10.0.0.1:4242",
        )
        assert cluster.namespaces == ("web", "jobs")
        assert cluster.connected_since == NOW
        assert cluster.last_seen == NOW
        assert (await reopened.get_certificate(0xABC)).fingerprint == "sha256:ab"
        assert (await reopened.find_user_by_token(hash_token("api"))) == await reopened.get_user(
            "ann"
        )
        assert (await reopened.get_grant("ann", "prod")).as_groups == ("view",)
        assert await reopened.list_audit() == [event]
        consumed = await reopened.consume_bootstrap_token(hash_token("t"), "prod", NOW)
        assert consumed.used_at == NOW
        assert await reopened.schema_version() == version
    finally:
        await reopened.close()


async def test_health_passes_while_open(store: Store) -> None:
    await store.health()
    assert store.write_failure is None


async def test_a_closed_store_refuses_every_call(open_store: OpenStore) -> None:
    store = await open_store()
    await store.close()
    with pytest.raises(StoreClosedError):
        await store.health()
    with pytest.raises(StoreClosedError):
        await store.list_clusters()


async def test_close_is_idempotent(open_store: OpenStore) -> None:
    store = await open_store()
    await store.close()
    await store.close()


async def test_async_with_closes_the_store(open_store: OpenStore) -> None:
    async with await open_store() as store:
        await store.health()
    with pytest.raises(StoreClosedError):
        await store.health()
