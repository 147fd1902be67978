"""The store's interface: token hashing, records and the error subtree."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

import pytest

from protocol.errors import TunnelError
from tunnel_server.store import (
    AlreadyExistsError,
    BootstrapTokenError,
    InvalidValueError,
    NotFoundError,
    PostgresStore,
    SchemaVersionError,
    SqliteStore,
    Store,
    StoreClosedError,
    StoreError,
    TokenClusterMismatchError,
    TokenExpiredError,
    TokenUnknownError,
    TokenUsedError,
    hash_token,
)
from tunnel_server.store.base import Cluster

WHEN = datetime(2024, 5, 1, 12, 30, 15, tzinfo=UTC)


def test_hash_token_is_the_sha256_hex_digest_of_the_token() -> None:
    assert hash_token("tbt_secret") == hashlib.sha256(b"tbt_secret").hexdigest()
    assert len(hash_token("")) == 64


def test_hash_token_differs_for_different_tokens() -> None:
    assert hash_token("a") != hash_token("b")


@pytest.mark.parametrize(
    "error",
    [
        StoreClosedError,
        SchemaVersionError,
        InvalidValueError,
        NotFoundError,
        AlreadyExistsError,
        BootstrapTokenError,
        TokenUnknownError,
        TokenUsedError,
        TokenExpiredError,
        TokenClusterMismatchError,
    ],
)
def test_every_store_error_is_a_tunnel_error(error: type[Exception]) -> None:
    assert issubclass(error, StoreError)
    assert issubclass(error, TunnelError)


def test_invalid_value_error_is_also_a_value_error() -> None:
    assert issubclass(InvalidValueError, ValueError)


@pytest.mark.parametrize(
    "error",
    [
        TokenUnknownError("prod"),
        TokenUsedError("prod", WHEN),
        TokenExpiredError("prod", WHEN),
        TokenClusterMismatchError("prod", "staging"),
    ],
)
def test_bootstrap_errors_say_how_to_get_a_new_token(error: BootstrapTokenError) -> None:
    assert isinstance(error, BootstrapTokenError)
    assert error.cluster == "prod"
    assert "`tunnelctl cluster token prod`" in str(error)


def test_token_used_error_says_when_it_was_used() -> None:
    error = TokenUsedError("prod", WHEN)
    assert "already used at 2024-05-01 12:30:15 UTC" in str(error)
    assert error.used_at == WHEN


def test_token_expired_error_says_when_it_expired() -> None:
    error = TokenExpiredError("prod", WHEN)
    assert "expired at 2024-05-01 12:30:15 UTC" in str(error)
    assert error.expires_at == WHEN


def test_cluster_mismatch_error_keeps_the_other_cluster_out_of_its_message() -> None:
    error = TokenClusterMismatchError("prod", "staging")
    assert error.token_cluster == "staging"
    assert "staging" not in str(error)
    assert "'prod'" in str(error)


def test_records_are_frozen() -> None:
    cluster = Cluster(name="prod", created_at=WHEN)
    with pytest.raises(AttributeError):
        cluster.name = "other"  # type: ignore[misc]


def test_sqlite_store_implements_every_abstract_method() -> None:
    assert issubclass(SqliteStore, Store)
    assert not getattr(SqliteStore, "__abstractmethods__", frozenset())


def test_postgres_store_implements_every_abstract_method() -> None:
    assert issubclass(PostgresStore, Store)
    assert not getattr(PostgresStore, "__abstractmethods__", frozenset())
