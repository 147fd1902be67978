"""Bootstrap tokens: each works once, for its own cluster, before it expires (each engine)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from tests.tunnel_server.store_engines import OpenStore
from tunnel_server.store import (
    AlreadyExistsError,
    BootstrapToken,
    BootstrapTokenError,
    InvalidValueError,
    NotFoundError,
    Store,
    TokenClusterMismatchError,
    TokenExpiredError,
    TokenUnknownError,
    TokenUsedError,
    hash_token,
)

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
EXPIRES = NOW + timedelta(hours=1)
TOKEN = hash_token("tbt_the-token")


@pytest.fixture
async def store(open_store: OpenStore) -> AsyncIterator[Store]:
    store = await open_store()
    for cluster in ("prod", "dev"):
        await store.add_cluster(cluster, NOW)
    await store.add_bootstrap_token(TOKEN, "prod", NOW, EXPIRES)
    yield store
    await store.close()


async def test_add_bootstrap_token_returns_the_unused_token(open_store: OpenStore) -> None:
    async with await open_store() as store:
        await store.add_cluster("prod", NOW)
        token = await store.add_bootstrap_token(TOKEN, "prod", NOW, EXPIRES)
    assert token == BootstrapToken(TOKEN, "prod", NOW, EXPIRES, used_at=None)


async def test_a_token_is_consumed_once_then_reported_used(store: Store) -> None:
    consumed = await store.consume_bootstrap_token(TOKEN, "prod", NOW + timedelta(minutes=5))
    assert consumed == BootstrapToken(TOKEN, "prod", NOW, EXPIRES, NOW + timedelta(minutes=5))
    with pytest.raises(TokenUsedError, match="already used at 2024-05-01 12:05:00 UTC") as caught:
        await store.consume_bootstrap_token(TOKEN, "prod", NOW + timedelta(minutes=6))
    assert caught.value.used_at == NOW + timedelta(minutes=5)


async def test_an_unknown_token_is_refused(store: Store) -> None:
    with pytest.raises(TokenUnknownError, match="tunnelctl cluster token prod"):
        await store.consume_bootstrap_token(hash_token("tbt_other"), "prod", NOW)


async def test_a_token_is_refused_at_and_after_its_expiry(store: Store) -> None:
    for when in (EXPIRES, EXPIRES + timedelta(seconds=1)):
        with pytest.raises(TokenExpiredError, match="expired at 2024-05-01 13:00:00 UTC"):
            await store.consume_bootstrap_token(TOKEN, "prod", when)
    # Refusals write nothing: a moment before expiry the token still works.
    almost = EXPIRES - timedelta(microseconds=1)
    assert (await store.consume_bootstrap_token(TOKEN, "prod", almost)).used_at == almost


async def test_a_token_of_another_cluster_is_refused_and_stays_unused(store: Store) -> None:
    with pytest.raises(TokenClusterMismatchError) as caught:
        await store.consume_bootstrap_token(TOKEN, "dev", NOW)
    assert caught.value.cluster == "dev"
    assert caught.value.token_cluster == "prod"
    assert (await store.consume_bootstrap_token(TOKEN, "prod", NOW)).used_at == NOW


async def test_another_clusters_token_is_refused_as_a_mismatch_even_once_used(
    store: Store,
) -> None:
    """The presenter learns nothing of the state of a token that is not theirs."""
    await store.consume_bootstrap_token(TOKEN, "prod", NOW)
    with pytest.raises(TokenClusterMismatchError):
        await store.consume_bootstrap_token(TOKEN, "dev", EXPIRES + timedelta(days=1))


async def test_a_used_token_is_reported_used_rather_than_expired(store: Store) -> None:
    await store.consume_bootstrap_token(TOKEN, "prod", NOW)
    with pytest.raises(TokenUsedError):
        await store.consume_bootstrap_token(TOKEN, "prod", EXPIRES + timedelta(days=1))


async def test_twenty_concurrent_consumers_of_one_token_succeed_exactly_once(
    store: Store,
) -> None:
    results = await asyncio.gather(
        *(store.consume_bootstrap_token(TOKEN, "prod", NOW) for _ in range(20)),
        return_exceptions=True,
    )
    successes = [r for r in results if isinstance(r, BootstrapToken)]
    assert len(successes) == 1
    assert all(isinstance(r, TokenUsedError) for r in results if r is not successes[0])


async def test_consumers_in_two_stores_on_one_database_succeed_exactly_once(
    store: Store, open_store: OpenStore
) -> None:
    """Atomic across connections too, as a second process (or replica) would be."""
    async with await open_store() as other:
        results = await asyncio.gather(
            *(
                (store if i % 2 else other).consume_bootstrap_token(TOKEN, "prod", NOW)
                for i in range(20)
            ),
            return_exceptions=True,
        )
    assert sum(isinstance(r, BootstrapToken) for r in results) == 1
    assert sum(isinstance(r, TokenUsedError) for r in results) == 19


async def test_a_token_for_an_unknown_cluster_is_refused(store: Store) -> None:
    with pytest.raises(NotFoundError, match="no cluster 'nope'"):
        await store.add_bootstrap_token(hash_token("t2"), "nope", NOW, EXPIRES)


async def test_adding_a_token_twice_raises_already_exists(store: Store) -> None:
    with pytest.raises(AlreadyExistsError):
        await store.add_bootstrap_token(TOKEN, "dev", NOW, EXPIRES)
    assert (await store.consume_bootstrap_token(TOKEN, "prod", NOW)).cluster == "prod"


async def test_raw_bootstrap_tokens_are_refused_in_place_of_hashes(store: Store) -> None:
    with pytest.raises(InvalidValueError, match="hash_token"):
        await store.add_bootstrap_token("tbt_raw", "prod", NOW, EXPIRES)
    with pytest.raises(InvalidValueError, match="hash_token"):
        await store.consume_bootstrap_token("tbt_raw", "prod", NOW)


async def test_refusals_never_quote_the_token_or_its_hash(store: Store) -> None:
    await store.add_bootstrap_token(hash_token("tbt_old"), "prod", NOW, NOW)
    attempts = [
        (hash_token("tbt_unknown"), "prod", NOW),
        (TOKEN, "dev", NOW),
        (hash_token("tbt_old"), "prod", NOW),
    ]
    for token_hash, cluster, when in attempts:
        with pytest.raises(BootstrapTokenError) as e:
            await store.consume_bootstrap_token(token_hash, cluster, when)
        assert token_hash not in str(e.value)
        assert "tbt_" not in str(e.value)
