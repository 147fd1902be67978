"""The audit trail: appended with ids, listed newest first, filtered and bounded."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tunnel_server.store import (
    MAX_AUDIT_LIMIT,
    AuditEvent,
    AuditKind,
    InvalidValueError,
    SqliteStore,
    sqlite_ops,
)
from tunnel_server.store.sqlite_codec import MAX_AUDIT_DETAIL_BYTES

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def event(
    minute: int = 0,
    *,
    user: str | None = "ann",
    cluster: str | None = "prod",
    kind: AuditKind = "proxy",
    verb: str = "get",
) -> AuditEvent:
    return AuditEvent(None, NOW + timedelta(minutes=minute), user, cluster, kind, verb)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    store = await SqliteStore.open(tmp_path / "state.db")
    yield store
    await store.close()


async def test_add_audit_assigns_increasing_ids(store: SqliteStore) -> None:
    first = await store.add_audit(event())
    second = await store.add_audit(event())
    assert first.id is not None
    assert second.id is not None
    assert second.id > first.id


async def test_add_audit_ignores_an_id_given_by_the_caller(store: SqliteStore) -> None:
    added = await store.add_audit(AuditEvent(999, NOW, "ann", "prod", "proxy", "get"))
    assert added.id == 1


async def test_every_field_round_trips(store: SqliteStore) -> None:
    added = await store.add_audit(
        AuditEvent(
            id=None,
            time=NOW,
            user="ann",
            cluster="prod",
            kind="command",
            verb="exec",
            path="/api/v1/namespaces/default/pods",
            status=201,
            bytes_in=12,
            bytes_out=3456,
            duration_ms=78,
            detail={"command": "restart", "args": ["a", 1, None, True], "nested": {"x": 1.5}},
        )
    )
    assert await store.list_audit() == [added]


async def test_events_without_user_or_cluster_are_kept(store: SqliteStore) -> None:
    added = await store.add_audit(event(user=None, cluster=None, kind="admin", verb="start"))
    assert await store.list_audit() == [added]


async def test_list_audit_is_newest_first_and_by_id_within_one_time(store: SqliteStore) -> None:
    middle = await store.add_audit(event(1))
    oldest = await store.add_audit(event(0))
    same_a = await store.add_audit(event(2))
    same_b = await store.add_audit(event(2))
    assert await store.list_audit() == [same_b, same_a, middle, oldest]


async def test_list_audit_filters_by_cluster_user_kind_and_since(store: SqliteStore) -> None:
    a = await store.add_audit(event(0, user="ann", cluster="prod", kind="proxy"))
    b = await store.add_audit(event(1, user="bob", cluster="prod", kind="command"))
    c = await store.add_audit(event(2, user="ann", cluster="dev", kind="command"))
    d = await store.add_audit(event(3, user="bob", cluster=None, kind="admin"))

    assert await store.list_audit(cluster="prod") == [b, a]
    assert await store.list_audit(user="ann") == [c, a]
    assert await store.list_audit(kind="command") == [c, b]
    assert await store.list_audit(since=NOW + timedelta(minutes=2)) == [d, c]  # inclusive
    assert await store.list_audit(cluster="prod", kind="command") == [b]
    assert await store.list_audit(user="bob", since=NOW + timedelta(minutes=2)) == [d]
    assert await store.list_audit(cluster="nowhere") == []


async def test_list_audit_returns_the_newest_within_the_limit(store: SqliteStore) -> None:
    added = [await store.add_audit(event(i)) for i in range(5)]
    assert await store.list_audit(limit=2) == [added[4], added[3]]


async def test_list_audit_defaults_to_a_hundred_events(store: SqliteStore) -> None:
    for i in range(105):
        await store.add_audit(event(i))
    assert len(await store.list_audit()) == 100


async def test_list_audit_never_returns_more_than_the_maximum(store: SqliteStore) -> None:
    for i in range(MAX_AUDIT_LIMIT + 5):
        await store.add_audit(event(i))
    listed = await store.list_audit(limit=10 * MAX_AUDIT_LIMIT)
    assert len(listed) == MAX_AUDIT_LIMIT
    assert listed[0].time == NOW + timedelta(minutes=MAX_AUDIT_LIMIT + 4)


@pytest.mark.parametrize("limit", [0, -1])
async def test_a_limit_below_one_is_refused(store: SqliteStore, limit: int) -> None:
    with pytest.raises(InvalidValueError, match="positive integer"):
        await store.list_audit(limit=limit)


async def test_an_unknown_kind_is_refused(store: SqliteStore) -> None:
    bad = AuditEvent(None, NOW, "ann", "prod", "shell", "get")  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="audit kind must be one of"):
        await store.add_audit(bad)
    with pytest.raises(InvalidValueError, match="audit kind must be one of"):
        await store.list_audit(kind="shell")  # type: ignore[arg-type]


async def test_a_detail_that_is_not_json_is_refused(store: SqliteStore) -> None:
    bad = AuditEvent(None, NOW, "ann", "prod", "proxy", "get", detail={"when": NOW})
    with pytest.raises(InvalidValueError, match="plain JSON"):
        await store.add_audit(bad)
    assert await store.list_audit() == []


async def test_a_detail_over_the_size_bound_is_refused(store: SqliteStore) -> None:
    big = {"blob": "x" * MAX_AUDIT_DETAIL_BYTES}
    with pytest.raises(InvalidValueError, match="record less"):
        await store.add_audit(AuditEvent(None, NOW, "ann", "prod", "proxy", "get", detail=big))


async def test_the_trail_outlives_the_users_and_clusters_it_names(store: SqliteStore) -> None:
    await store.add_cluster("prod", NOW)
    await store.add_user("ann", (), False, NOW)
    added = await store.add_audit(event())
    await store.delete_user("ann")
    await store.delete_cluster("prod")
    assert await store.list_audit(user="ann", cluster="prod") == [added]


async def test_delete_audit_before_prunes_only_older_events(store: SqliteStore) -> None:
    added = [await store.add_audit(event(i)) for i in range(4)]
    assert await store.delete_audit_before(NOW + timedelta(minutes=2)) == 2
    assert await store.list_audit() == [added[3], added[2]]
    newer = await store.add_audit(event(5))
    assert newer.id is not None
    assert added[3].id is not None
    assert newer.id > added[3].id


async def test_a_batch_of_events_is_stored_whole(store: SqliteStore) -> None:
    batch = [event(minute, verb=f"verb-{minute}") for minute in range(3)]
    assert await store.add_audit_events(batch) == 3
    listed = await store.list_audit()
    assert [e.verb for e in listed] == ["verb-2", "verb-1", "verb-0"]
    assert all(e.id is not None and e.user == "ann" for e in listed)


async def test_a_batch_with_one_invalid_event_stores_none_of_it(store: SqliteStore) -> None:
    oversized = AuditEvent(
        None, NOW, "ann", "prod", "proxy", "get", detail={"x": "y" * MAX_AUDIT_DETAIL_BYTES}
    )
    with pytest.raises(InvalidValueError, match="audit detail is over"):
        await store.add_audit_events([event(0), oversized, event(2)])
    assert await store.list_audit() == []


async def test_a_batch_the_database_refuses_midway_stores_none_of_it(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Let a bad kind past the Python check, so that the table's CHECK refuses
    # the second row inside executemany, after the first was inserted.
    monkeypatch.setattr(sqlite_ops, "check_kind", lambda kind: kind)
    bad = AuditEvent(None, NOW, "ann", "prod", "teleport", "get")  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="refused a value"):
        await store.add_audit_events([event(0), bad, event(2)])
    assert await store.list_audit() == []
