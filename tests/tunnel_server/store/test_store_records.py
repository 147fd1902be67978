"""The store's clusters, certificates, users, API tokens and grants, on each engine."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from tunnel_server.store import (
    AlreadyExistsError,
    Grant,
    InvalidValueError,
    NotFoundError,
    Store,
    TokenUnknownError,
    hash_token,
)
from tunnel_server.store.sqlite_ops import TOKEN_TOUCH_INTERVAL

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
LATER = NOW + timedelta(hours=1)
DAY = timedelta(days=1)


# --- clusters -------------------------------------------------------------------


async def test_add_cluster_returns_what_get_cluster_reads_back(store: Store) -> None:
    added = await store.add_cluster("prod", NOW)
    assert added.name == "prod"
    assert added.created_at == NOW
    assert added.rbac == "full"
    assert (added.agent_version, added.remote_addr) == (None, None)
    assert (added.connected_since, added.last_seen) == (None, None)
    assert await store.get_cluster("prod") == added


async def test_add_cluster_keeps_the_rbac_mode_given(store: Store) -> None:
    await store.add_cluster("prod", NOW, rbac="readonly")
    assert (await store.get_cluster("prod")).rbac == "readonly"


async def test_adding_a_cluster_twice_raises_already_exists(store: Store) -> None:
    await store.add_cluster("prod", NOW)
    with pytest.raises(AlreadyExistsError, match="'prod' already exists"):
        await store.add_cluster("prod", LATER)
    assert (await store.get_cluster("prod")).created_at == NOW


async def test_get_cluster_of_an_unknown_name_raises_not_found(store: Store) -> None:
    with pytest.raises(NotFoundError, match="no cluster 'nope'"):
        await store.get_cluster("nope")


async def test_list_clusters_returns_every_cluster_by_name(store: Store) -> None:
    assert await store.list_clusters() == []
    for name in ("b", "c", "a"):
        await store.add_cluster(name, NOW)
    assert [c.name for c in await store.list_clusters()] == ["a", "b", "c"]


async def test_times_are_returned_in_utc_with_microseconds(store: Store) -> None:
    tokyo = timezone(timedelta(hours=9))
    local = datetime(2024, 5, 1, 21, 0, 0, 123456, tzinfo=tokyo)
    added = await store.add_cluster("prod", local)
    read = await store.get_cluster("prod")
    assert read.created_at == local
    assert read.created_at.tzinfo is UTC
    assert added.created_at.tzinfo is UTC
    assert read.created_at.microsecond == 123456


async def test_naive_times_are_refused(store: Store) -> None:
    with pytest.raises(InvalidValueError, match="timezone-aware"):
        await store.add_cluster("prod", datetime(2024, 5, 1, 12, 0))
    assert await store.list_clusters() == []


async def test_record_connection_persists_what_is_known_of_the_agent(store: Store) -> None:
    await store.add_cluster("prod", NOW)
    recorded = await store.record_connection("prod", "0.4.1", "192.0.2.7:50123", NOW, LATER)
    assert recorded == await store.get_cluster("prod")
    assert recorded.agent_version == "0.4.1"
    assert recorded.remote_addr == "192.0.2.7:50123"
    assert recorded.connected_since == NOW
    assert recorded.last_seen == LATER


async def test_record_connection_on_disconnect_clears_connected_since(store: Store) -> None:
    await store.add_cluster("prod", NOW)
    await store.record_connection("prod", "0.4.1", "192.0.2.7:50123", NOW, NOW)
    recorded = await store.record_connection("prod", "0.4.1", "192.0.2.7:50123", None, LATER)
    assert recorded.connected_since is None
    assert recorded.last_seen == LATER


async def test_record_connection_of_an_unknown_cluster_raises_not_found(
    store: Store,
) -> None:
    with pytest.raises(NotFoundError):
        await store.record_connection("nope", "0.4.1", None, NOW, NOW)


async def test_touch_cluster_updates_last_seen_only(store: Store) -> None:
    await store.add_cluster("prod", NOW)
    await store.record_connection("prod", "0.4.1", "192.0.2.7:1", NOW, NOW)
    await store.touch_cluster("prod", LATER)
    cluster = await store.get_cluster("prod")
    assert cluster.last_seen == LATER
    assert (cluster.agent_version, cluster.connected_since) == ("0.4.1", NOW)


async def test_touch_cluster_of_an_unknown_cluster_raises_not_found(store: Store) -> None:
    with pytest.raises(NotFoundError):
        await store.touch_cluster("nope", NOW)


async def test_delete_cluster_forgets_it(store: Store) -> None:
    await store.add_cluster("prod", NOW)
    await store.delete_cluster("prod")
    assert await store.list_clusters() == []
    with pytest.raises(NotFoundError):
        await store.get_cluster("prod")


async def test_delete_cluster_of_an_unknown_name_raises_not_found(store: Store) -> None:
    with pytest.raises(NotFoundError):
        await store.delete_cluster("nope")


async def test_delete_cluster_cascades_to_its_tokens_and_grants_only(store: Store) -> None:
    for name in ("prod", "dev"):
        await store.add_cluster(name, NOW)
        await store.add_bootstrap_token(hash_token(name), name, NOW, LATER)
    await store.add_user("ann", (), False, NOW)
    await store.set_grant(Grant("ann", "prod"))
    await store.set_grant(Grant("ann", "dev"))

    await store.delete_cluster("prod")

    with pytest.raises(TokenUnknownError):
        await store.consume_bootstrap_token(hash_token("prod"), "prod", NOW)
    assert await store.list_grants() == [Grant("ann", "dev")]
    assert (await store.consume_bootstrap_token(hash_token("dev"), "dev", NOW)).used_at == NOW
    assert (await store.get_user("ann")).name == "ann"


async def test_delete_cluster_revokes_its_certificates_for_good(store: Store) -> None:
    await store.add_cluster("prod", NOW)
    await store.record_certificate(1, "prod", "fp1", NOW, NOW + DAY)
    await store.delete_cluster("prod", now=LATER)
    assert (await store.get_certificate(1)).revoked_at == LATER
    # A new cluster of the same name does not make the old certificate good again.
    await store.add_cluster("prod", LATER)
    assert await store.revoked_serials() == {1}


async def test_delete_cluster_keeps_the_earlier_revocation_time(store: Store) -> None:
    await store.add_cluster("prod", NOW)
    await store.record_certificate(1, "prod", "fp1", NOW, NOW + DAY)
    await store.revoke_cluster_certificates("prod", NOW)
    await store.delete_cluster("prod", now=LATER)
    assert (await store.get_certificate(1)).revoked_at == NOW


# --- certificates ---------------------------------------------------------------


async def test_record_certificate_returns_what_get_certificate_reads_back(
    store: Store,
) -> None:
    await store.add_cluster("prod", NOW)
    recorded = await store.record_certificate(0x1F, "prod", "sha256:00ff", NOW, NOW + DAY)
    assert recorded.serial == 0x1F
    assert (recorded.cluster, recorded.fingerprint) == ("prod", "sha256:00ff")
    assert (recorded.not_before, recorded.not_after, recorded.revoked_at) == (NOW, NOW + DAY, None)
    assert await store.get_certificate(0x1F) == recorded


async def test_serials_of_160_bits_round_trip(store: Store) -> None:
    await store.add_cluster("prod", NOW)
    serial = 2**160 - 1
    await store.record_certificate(serial, "prod", "fp", NOW, NOW + DAY)
    assert (await store.get_certificate(serial)).serial == serial


@pytest.mark.parametrize("serial", [-1, 2**160])
async def test_serials_outside_x509_range_are_refused(store: Store, serial: int) -> None:
    await store.add_cluster("prod", NOW)
    with pytest.raises(InvalidValueError, match="160 bits"):
        await store.record_certificate(serial, "prod", "fp", NOW, NOW + DAY)


async def test_recording_a_serial_twice_raises_already_exists(store: Store) -> None:
    await store.add_cluster("prod", NOW)
    await store.record_certificate(7, "prod", "fp", NOW, NOW + DAY)
    with pytest.raises(AlreadyExistsError, match="0x7"):
        await store.record_certificate(7, "prod", "other", NOW, NOW + DAY)


async def test_record_certificate_for_an_unknown_cluster_raises_not_found(
    store: Store,
) -> None:
    with pytest.raises(NotFoundError, match="no cluster 'nope'"):
        await store.record_certificate(7, "nope", "fp", NOW, NOW + DAY)


async def test_get_certificate_of_an_unknown_serial_raises_not_found(store: Store) -> None:
    with pytest.raises(NotFoundError, match="0xabc"):
        await store.get_certificate(0xABC)


async def test_revoke_cluster_certificates_revokes_that_clusters_unrevoked_ones(
    store: Store,
) -> None:
    for name in ("prod", "dev"):
        await store.add_cluster(name, NOW)
    await store.record_certificate(1, "prod", "fp1", NOW, NOW + DAY)
    await store.record_certificate(2, "prod", "fp2", NOW, NOW + DAY)
    await store.record_certificate(3, "dev", "fp3", NOW, NOW + DAY)
    assert await store.revoked_serials() == set()

    assert await store.revoke_cluster_certificates("prod", LATER) == 2
    assert await store.revoked_serials() == {1, 2}
    assert (await store.get_certificate(1)).revoked_at == LATER
    assert (await store.get_certificate(3)).revoked_at is None

    await store.record_certificate(4, "prod", "fp4", NOW, NOW + DAY)
    assert await store.revoke_cluster_certificates("prod", LATER + DAY) == 1
    assert (await store.get_certificate(1)).revoked_at == LATER  # not revoked twice
    assert await store.revoked_serials() == {1, 2, 4}


async def test_revoke_cluster_certificates_of_an_unknown_cluster_raises_not_found(
    store: Store,
) -> None:
    with pytest.raises(NotFoundError):
        await store.revoke_cluster_certificates("nope", NOW)


# --- users ----------------------------------------------------------------------


async def test_add_user_returns_what_get_user_reads_back(store: Store) -> None:
    added = await store.add_user("ann", ("dev", "ops"), True, NOW)
    assert (added.name, added.groups, added.is_admin, added.created_at) == (
        "ann",
        ("dev", "ops"),
        True,
        NOW,
    )
    assert await store.get_user("ann") == added


async def test_adding_a_user_twice_raises_already_exists(store: Store) -> None:
    await store.add_user("ann", (), False, NOW)
    with pytest.raises(AlreadyExistsError, match="'ann' already exists"):
        await store.add_user("ann", ("x",), True, NOW)


async def test_groups_must_be_a_tuple_of_strings(store: Store) -> None:
    with pytest.raises(InvalidValueError, match="tuple of strings"):
        await store.add_user("ann", ("dev", 3), False, NOW)  # type: ignore[arg-type]


async def test_get_user_of_an_unknown_name_raises_not_found(store: Store) -> None:
    with pytest.raises(NotFoundError, match="no user 'nope'"):
        await store.get_user("nope")


async def test_list_users_returns_every_user_by_name(store: Store) -> None:
    for name in ("bob", "ann"):
        await store.add_user(name, (), False, NOW)
    assert [u.name for u in await store.list_users()] == ["ann", "bob"]


async def test_delete_user_cascades_to_their_tokens_and_grants(store: Store) -> None:
    await store.add_cluster("prod", NOW)
    for name in ("ann", "bob"):
        await store.add_user(name, (), False, NOW)
        await store.add_api_token(hash_token(name), name, NOW)
        await store.set_grant(Grant(name, "prod"))

    await store.delete_user("ann")

    assert [u.name for u in await store.list_users()] == ["bob"]
    assert await store.find_user_by_token(hash_token("ann")) is None
    assert await store.list_grants() == [Grant("bob", "prod")]
    assert await store.find_user_by_token(hash_token("bob")) is not None


async def test_delete_user_of_an_unknown_name_raises_not_found(store: Store) -> None:
    with pytest.raises(NotFoundError):
        await store.delete_user("nope")


# --- API tokens -----------------------------------------------------------------


async def test_find_user_by_token_finds_the_tokens_user(store: Store) -> None:
    ann = await store.add_user("ann", ("dev",), False, NOW)
    token = await store.add_api_token(hash_token("secret"), "ann", NOW)
    assert (token.user, token.created_at, token.last_used_at) == ("ann", NOW, None)
    assert await store.find_user_by_token(hash_token("secret")) == ann


async def test_a_token_with_an_expiry_is_refused_from_then_on(store: Store) -> None:
    ann = await store.add_user("ann", (), False, NOW)
    expires_at = NOW + timedelta(hours=8)
    token = await store.add_api_token(hash_token("secret"), "ann", NOW, expires_at)
    assert token.expires_at == expires_at
    assert [t.expires_at for t in await store.list_api_tokens("ann")] == [expires_at]

    before = expires_at - timedelta(seconds=1)
    assert await store.find_user_by_token(hash_token("secret"), before) == ann
    assert await store.find_user_by_token(hash_token("secret"), expires_at) is None


async def test_a_token_with_an_expiry_is_checked_against_the_clock_without_now(
    store: Store,
) -> None:
    await store.add_user("ann", (), False, NOW)
    # NOW is in 2024: the token made then for a day has expired by the clock.
    await store.add_api_token(hash_token("old"), "ann", NOW, NOW + timedelta(days=1))
    await store.add_api_token(hash_token("forever"), "ann", NOW)
    assert await store.find_user_by_token(hash_token("old")) is None
    assert await store.find_user_by_token(hash_token("forever")) is not None


async def test_tokens_that_expired_are_forgotten_when_another_is_added(
    store: Store,
) -> None:
    for name in ("ann", "bob"):
        await store.add_user(name, (), False, NOW)
    await store.add_api_token(hash_token("gone"), "ann", NOW, NOW + timedelta(hours=1))
    await store.add_api_token(hash_token("kept"), "ann", NOW, NOW + timedelta(hours=3))
    await store.add_api_token(hash_token("forever"), "ann", NOW)

    await store.add_api_token(hash_token("bob's"), "bob", NOW + timedelta(hours=2))

    assert {t.token_hash for t in await store.list_api_tokens("ann")} == {
        hash_token("kept"),
        hash_token("forever"),
    }


async def test_find_user_by_an_unknown_token_returns_none(store: Store) -> None:
    assert await store.find_user_by_token(hash_token("nobody's")) is None


async def test_raw_tokens_are_refused_in_place_of_hashes(store: Store) -> None:
    await store.add_user("ann", (), False, NOW)
    with pytest.raises(InvalidValueError, match="hash_token"):
        await store.add_api_token("tat_a-raw-token", "ann", NOW)
    with pytest.raises(InvalidValueError, match="hash_token"):
        await store.find_user_by_token("tat_a-raw-token")


async def test_add_api_token_for_an_unknown_user_raises_not_found(store: Store) -> None:
    with pytest.raises(NotFoundError):
        await store.add_api_token(hash_token("t"), "nope", NOW)


async def test_adding_an_api_token_twice_raises_already_exists(store: Store) -> None:
    await store.add_user("ann", (), False, NOW)
    await store.add_api_token(hash_token("t"), "ann", NOW)
    with pytest.raises(AlreadyExistsError):
        await store.add_api_token(hash_token("t"), "ann", NOW)


async def test_a_user_may_hold_several_tokens(store: Store) -> None:
    await store.add_user("ann", (), False, NOW)
    await store.add_api_token(hash_token("one"), "ann", NOW)
    await store.add_api_token(hash_token("two"), "ann", LATER)
    tokens = await store.list_api_tokens("ann")
    assert [t.token_hash for t in tokens] == [hash_token("one"), hash_token("two")]


async def test_find_user_by_token_records_use_at_most_once_a_minute(store: Store) -> None:
    await store.add_user("ann", (), False, NOW)
    await store.add_api_token(hash_token("t"), "ann", NOW)

    async def last_used() -> datetime | None:
        return (await store.list_api_tokens("ann"))[0].last_used_at

    await store.find_user_by_token(hash_token("t"))
    assert await last_used() is None  # without `now`, nothing is recorded
    await store.find_user_by_token(hash_token("t"), NOW)
    assert await last_used() == NOW
    await store.find_user_by_token(hash_token("t"), NOW + TOKEN_TOUCH_INTERVAL)
    assert await last_used() == NOW
    await store.find_user_by_token(hash_token("t"), LATER)
    assert await last_used() == LATER


async def test_list_api_tokens_of_an_unknown_user_raises_not_found(store: Store) -> None:
    with pytest.raises(NotFoundError):
        await store.list_api_tokens("nope")


async def test_revoke_api_tokens_deletes_that_users_tokens(store: Store) -> None:
    for name in ("ann", "bob"):
        await store.add_user(name, (), False, NOW)
    await store.add_api_token(hash_token("a1"), "ann", NOW)
    await store.add_api_token(hash_token("a2"), "ann", NOW)
    await store.add_api_token(hash_token("b1"), "bob", NOW)

    assert await store.revoke_api_tokens("ann") == 2
    assert await store.find_user_by_token(hash_token("a1")) is None
    assert await store.find_user_by_token(hash_token("a2")) is None
    assert await store.find_user_by_token(hash_token("b1")) is not None
    assert await store.revoke_api_tokens("ann") == 0
    assert (await store.get_user("ann")).name == "ann"


async def test_revoke_api_tokens_of_an_unknown_user_raises_not_found(store: Store) -> None:
    with pytest.raises(NotFoundError):
        await store.revoke_api_tokens("nope")


# --- grants ---------------------------------------------------------------------


@pytest.fixture
async def people(store: Store) -> Store:
    """Users ann and bob, clusters prod and dev."""
    for user in ("ann", "bob"):
        await store.add_user(user, (), False, NOW)
    for cluster in ("prod", "dev"):
        await store.add_cluster(cluster, NOW)
    return store


async def test_set_grant_stores_what_get_grant_reads_back(people: Store) -> None:
    grant = Grant("ann", "prod", ("view", "edit"), commands=True, impersonate=True)
    await people.set_grant(grant)
    assert await people.get_grant("ann", "prod") == grant


async def test_a_grant_keeps_whom_its_user_may_impersonate(people: Store) -> None:
    grant = Grant("ann", "prod", impersonate=True, impersonate_targets=("bob", "group:ops"))
    await people.set_grant(grant)
    assert await people.get_grant("ann", "prod") == grant
    narrower = Grant("ann", "prod", impersonate=True, impersonate_targets=("bob",))
    await people.set_grant(narrower)
    assert await people.list_grants() == [narrower]


async def test_set_grant_replaces_the_existing_grant(people: Store) -> None:
    await people.set_grant(Grant("ann", "prod", ("view",), commands=True))
    await people.set_grant(Grant("ann", "prod", ("admin",), impersonate=True))
    assert await people.list_grants() == [Grant("ann", "prod", ("admin",), impersonate=True)]


async def test_set_grant_for_an_unknown_user_or_cluster_raises_not_found(
    people: Store,
) -> None:
    with pytest.raises(NotFoundError, match="no user 'nope'"):
        await people.set_grant(Grant("nope", "prod"))
    with pytest.raises(NotFoundError, match="no cluster 'nope'"):
        await people.set_grant(Grant("ann", "nope"))


async def test_get_grant_that_does_not_exist_raises_not_found(people: Store) -> None:
    with pytest.raises(NotFoundError, match="'ann' has no grant on cluster 'prod'"):
        await people.get_grant("ann", "prod")


async def test_list_grants_filters_by_user_and_cluster(people: Store) -> None:
    grants = [Grant(u, c) for u in ("ann", "bob") for c in ("dev", "prod")]
    for grant in reversed(grants):
        await people.set_grant(grant)
    assert await people.list_grants() == grants
    assert await people.list_grants(user="bob") == grants[2:]
    assert await people.list_grants(cluster="prod") == [grants[1], grants[3]]
    assert await people.list_grants(user="ann", cluster="dev") == [grants[0]]
    assert await people.list_grants(user="nobody") == []


async def test_delete_grant_removes_only_that_grant(people: Store) -> None:
    await people.set_grant(Grant("ann", "prod"))
    await people.set_grant(Grant("ann", "dev"))
    await people.delete_grant("ann", "prod")
    assert await people.list_grants() == [Grant("ann", "dev")]
    with pytest.raises(NotFoundError):
        await people.delete_grant("ann", "prod")
