"""The audit trail: appended with ids, listed newest first, filtered and bounded (each engine)."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tunnel_server.store import (
    MAX_AUDIT_LIMIT,
    AuditEvent,
    AuditKind,
    InvalidValueError,
    ProxyAuditRecord,
    SqliteStore,
    Store,
    postgres_audit,
    sqlite_audit,
)
from tunnel_server.store.sqlite_codec import MAX_AUDIT_DETAIL_BYTES, encode_time

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
async def sqlite_store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    store = await SqliteStore.open(tmp_path / "state.db")
    yield store
    await store.close()


async def test_add_audit_assigns_increasing_ids(store: Store) -> None:
    first = await store.add_audit(event())
    second = await store.add_audit(event())
    assert first.id is not None
    assert second.id is not None
    assert second.id > first.id


async def test_add_audit_ignores_an_id_given_by_the_caller(store: Store) -> None:
    added = await store.add_audit(AuditEvent(999, NOW, "ann", "prod", "proxy", "get"))
    assert added.id == 1


async def test_every_field_round_trips(store: Store) -> None:
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


async def test_events_without_user_or_cluster_are_kept(store: Store) -> None:
    added = await store.add_audit(event(user=None, cluster=None, kind="admin", verb="start"))
    assert await store.list_audit() == [added]


async def test_list_audit_is_newest_first_and_by_id_within_one_time(store: Store) -> None:
    middle = await store.add_audit(event(1))
    oldest = await store.add_audit(event(0))
    same_a = await store.add_audit(event(2))
    same_b = await store.add_audit(event(2))
    assert await store.list_audit() == [same_b, same_a, middle, oldest]


async def test_list_audit_filters_by_cluster_user_kind_and_since(store: Store) -> None:
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


async def test_list_audit_returns_the_newest_within_the_limit(store: Store) -> None:
    added = [await store.add_audit(event(i)) for i in range(5)]
    assert await store.list_audit(limit=2) == [added[4], added[3]]


async def test_list_audit_defaults_to_a_hundred_events(store: Store) -> None:
    for i in range(105):
        await store.add_audit(event(i))
    assert len(await store.list_audit()) == 100


async def test_list_audit_never_returns_more_than_the_maximum(store: Store) -> None:
    for i in range(MAX_AUDIT_LIMIT + 5):
        await store.add_audit(event(i))
    listed = await store.list_audit(limit=10 * MAX_AUDIT_LIMIT)
    assert len(listed) == MAX_AUDIT_LIMIT
    assert listed[0].time == NOW + timedelta(minutes=MAX_AUDIT_LIMIT + 4)


@pytest.mark.parametrize("limit", [0, -1])
async def test_a_limit_below_one_is_refused(store: Store, limit: int) -> None:
    with pytest.raises(InvalidValueError, match="positive integer"):
        await store.list_audit(limit=limit)


async def test_an_unknown_kind_is_refused(store: Store) -> None:
    bad = AuditEvent(None, NOW, "ann", "prod", "shell", "get")  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="audit kind must be one of"):
        await store.add_audit(bad)
    with pytest.raises(InvalidValueError, match="audit kind must be one of"):
        await store.list_audit(kind="shell")  # type: ignore[arg-type]


async def test_a_detail_that_is_not_json_is_refused(store: Store) -> None:
    bad = AuditEvent(None, NOW, "ann", "prod", "proxy", "get", detail={"when": NOW})
    with pytest.raises(InvalidValueError, match="plain JSON"):
        await store.add_audit(bad)
    assert await store.list_audit() == []


async def test_a_detail_over_the_size_bound_is_refused(store: Store) -> None:
    big = {"blob": "x" * MAX_AUDIT_DETAIL_BYTES}
    with pytest.raises(InvalidValueError, match="record less"):
        await store.add_audit(AuditEvent(None, NOW, "ann", "prod", "proxy", "get", detail=big))


async def test_the_trail_outlives_the_users_and_clusters_it_names(store: Store) -> None:
    await store.add_cluster("prod", NOW)
    await store.add_user("ann", (), False, NOW)
    added = await store.add_audit(event())
    await store.delete_user("ann")
    await store.delete_cluster("prod")
    assert await store.list_audit(user="ann", cluster="prod") == [added]


async def test_delete_audit_before_prunes_only_older_events(store: Store) -> None:
    added = [await store.add_audit(event(i)) for i in range(4)]
    assert await store.delete_audit_before(NOW + timedelta(minutes=2)) == 2
    assert await store.list_audit() == [added[3], added[2]]
    newer = await store.add_audit(event(5))
    assert newer.id is not None
    assert added[3].id is not None
    assert newer.id > added[3].id


async def test_a_batch_of_events_is_stored_whole(store: Store) -> None:
    batch = [event(minute, verb=f"verb-{minute}") for minute in range(3)]
    assert await store.add_audit_events(batch) == 3
    listed = await store.list_audit()
    assert [e.verb for e in listed] == ["verb-2", "verb-1", "verb-0"]
    assert all(e.id is not None and e.user == "ann" for e in listed)


async def test_a_batch_with_one_invalid_event_stores_none_of_it(store: Store) -> None:
    oversized = AuditEvent(
        None, NOW, "ann", "prod", "proxy", "get", detail={"x": "y" * MAX_AUDIT_DETAIL_BYTES}
    )
    with pytest.raises(InvalidValueError, match="audit detail is over"):
        await store.add_audit_events([event(0), oversized, event(2)])
    assert await store.list_audit() == []


async def test_a_batch_the_database_refuses_midway_stores_none_of_it(
    store: Store, engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Let a bad kind past the Python check, so that the table's CHECK refuses
    # the second row inside executemany, after the first was inserted.
    module = sqlite_audit if engine == "sqlite" else postgres_audit
    monkeypatch.setattr(module, "check_kind", lambda kind: kind)
    bad = AuditEvent(None, NOW, "ann", "prod", "teleport", "get")  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="refused a value"):
        await store.add_audit_events([event(0), bad, event(2)])
    assert await store.list_audit() == []


def proxied(time_us: int, *, verb: str = "get", user: str = "ann") -> ProxyAuditRecord:
    return ProxyAuditRecord(time_us, user, "prod", verb, "/api/v1/pods", 200, 12, 345, 6)


def micros(moment: datetime) -> int:
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


async def test_a_proxied_request_reads_back_as_a_proxy_event(store: Store) -> None:
    assert await store.add_proxy_audit([proxied(micros(NOW))]) == 1
    [stored] = await store.list_audit()
    assert stored == AuditEvent(
        id=stored.id,
        time=NOW,
        user="ann",
        cluster="prod",
        kind="proxy",
        verb="get",
        path="/api/v1/pods",
        status=200,
        bytes_in=12,
        bytes_out=345,
        duration_ms=6,
        detail={},
    )
    assert stored.id is not None


async def test_a_proxied_request_that_ended_short_says_why_in_its_detail(
    store: Store,
) -> None:
    # SQLite writes the JSON: quotes, backslashes and non-ASCII must come back as given.
    why = 'access revoked: user "ann" \\ no longer has a grant on cluster prød'
    whole = proxied(micros(NOW))
    cut = whole._replace(ended=why)
    await store.add_proxy_audit([whole, cut, whole, cut, cut])
    listed = await store.list_audit()
    ended = {"ended": why}
    assert [e.detail for e in reversed(listed)] == [{}, ended, {}, ended, ended]


async def test_a_proxied_request_keeps_the_identity_sent_in_its_detail(
    store: Store,
) -> None:
    """``as``: who the cluster was told the caller is; beside ``ended`` when both are there."""
    identity = '{"user":"tunnel:alice","groups":["tunnel:platform"],"impersonated":true}'
    as_alice = {"user": "tunnel:alice", "groups": ["tunnel:platform"], "impersonated": True}
    whole = proxied(micros(NOW))._replace(identity=identity)
    cut = whole._replace(ended="the caller left")
    refused = proxied(micros(NOW))._replace(ended="no grant")
    await store.add_proxy_audit([whole, cut, refused])
    listed = await store.list_audit()
    assert [e.detail for e in reversed(listed)] == [
        {"as": as_alice},
        {"ended": "the caller left", "as": as_alice},
        {"ended": "no grant"},
    ]


def moments() -> list[datetime]:
    rng = random.Random(7)
    chosen = [datetime(1970, 1, 1, tzinfo=UTC), NOW, NOW + timedelta(microseconds=999_999)]
    return chosen + [NOW + timedelta(microseconds=rng.randrange(10**15)) for _ in range(300)]


async def test_proxied_times_read_back_to_the_microsecond(store: Store) -> None:
    times = moments()
    await store.add_proxy_audit([proxied(micros(moment)) for moment in times])
    listed = await store.list_audit(limit=MAX_AUDIT_LIMIT)
    assert sorted(e.time for e in listed) == sorted(times)


async def test_proxied_times_are_stored_as_the_store_writes_every_time(
    sqlite_store: SqliteStore,
) -> None:
    # The text SQLite makes must be encode_time's, to the microsecond, or the
    # trail would not sort and filter as one.
    store = sqlite_store
    times = moments()
    await store.add_proxy_audit([proxied(micros(moment)) for moment in times])
    texts = await store._run(lambda db: [row[0] for row in db.execute("SELECT time FROM audit")])
    assert sorted(texts) == sorted(encode_time(moment) for moment in times)


@pytest.mark.parametrize("size", [1, 5, 300, 777])
async def test_a_batch_of_proxied_requests_is_stored_whole_and_in_order(
    store: Store, size: int
) -> None:
    # Batches are cut into statements of 256, 64, 16, 4 and 1 rows.
    start = micros(NOW)
    batch = [proxied(start, verb=f"verb-{i}") for i in range(size)]
    assert await store.add_proxy_audit(batch) == size
    listed = await store.list_audit(limit=MAX_AUDIT_LIMIT)
    assert [e.verb for e in reversed(listed)] == [f"verb-{i}" for i in range(size)]


async def test_proxied_and_other_events_share_one_trail(store: Store) -> None:
    other = await store.add_audit(event(0, kind="command"))
    await store.add_proxy_audit([proxied(micros(NOW + timedelta(minutes=1)), user="bob")])
    listed = await store.list_audit()
    assert [(e.kind, e.user) for e in listed] == [("proxy", "bob"), ("command", "ann")]
    assert listed[1] == other
    assert await store.list_audit(user="bob", kind="proxy") == listed[:1]


async def test_a_proxied_batch_with_a_time_before_1970_stores_none_of_it(
    store: Store,
) -> None:
    with pytest.raises(InvalidValueError, match="before 1970"):
        await store.add_proxy_audit([proxied(micros(NOW)), proxied(-1)])
    assert await store.list_audit() == []
