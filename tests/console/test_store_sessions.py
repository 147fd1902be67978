"""The console's sessions and questions in the store, on each engine."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta

import pytest

from tunnel_server.store import AuditEvent, NotFoundError, Store, hash_token
from tunnel_server.store.commands import NewCommand
from tunnel_server.store.console import AuditQuery, ConsoleSession

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


async def signed_in(store: Store, user: str = "ann", *, hours: float = 8) -> ConsoleSession:
    """A session of ``user`` (made with a new API token of theirs)."""
    token_hash = hash_token(secrets.token_hex(16))
    await store.add_api_token(token_hash, user, NOW)
    session = ConsoleSession(
        session_hash=hash_token(secrets.token_hex(16)),
        user=user,
        token_hash=token_hash,
        created_at=NOW,
        expires_at=NOW + timedelta(hours=hours),
    )
    await store.add_console_session(session)
    return session


@pytest.fixture
async def ann(store: Store) -> Store:
    await store.add_user("ann", (), False, NOW)
    return store


async def test_a_session_is_found_by_its_hash_until_it_expires(ann: Store) -> None:
    session = await signed_in(ann)
    assert await ann.get_console_session(session.session_hash, NOW) == session
    later = session.expires_at
    assert await ann.get_console_session(session.session_hash, later) is None
    assert await ann.get_console_session(hash_token("other"), NOW) is None


async def test_signing_out_deletes_the_session(ann: Store) -> None:
    session = await signed_in(ann)
    assert await ann.delete_console_session(session.session_hash)
    assert await ann.get_console_session(session.session_hash, NOW) is None
    assert not await ann.delete_console_session(session.session_hash)


async def test_a_session_goes_with_its_token_and_its_user(ann: Store) -> None:
    session = await signed_in(ann)
    await ann.revoke_api_tokens("ann")
    assert await ann.get_console_session(session.session_hash, NOW) is None
    session = await signed_in(ann)
    await ann.delete_user("ann")
    assert await ann.get_console_session(session.session_hash, NOW) is None


async def test_a_session_needs_a_live_token(ann: Store) -> None:
    session = ConsoleSession(hash_token("s"), "ann", hash_token("t"), NOW, NOW + timedelta(hours=1))
    with pytest.raises(NotFoundError):
        await ann.add_console_session(session)


async def test_expired_sessions_are_forgotten_when_another_begins(ann: Store) -> None:
    old = await signed_in(ann, hours=1)
    token_hash = hash_token(secrets.token_hex(16))
    await ann.add_api_token(token_hash, "ann", NOW)
    later = NOW + timedelta(hours=2)
    await ann.add_console_session(
        ConsoleSession(hash_token("new"), "ann", token_hash, later, later + timedelta(hours=1))
    )
    # Gone from the table, not only hidden by its expiry.
    assert await ann.get_console_session(old.session_hash, NOW) is None


async def test_active_command_counts_per_cluster(store: Store) -> None:
    await store.add_cluster("prod", NOW)
    await store.add_cluster("dev", NOW)
    for index, cluster in enumerate(("prod", "prod", "dev")):
        command = NewCommand(f"c{index}", cluster, "ann", "query", "q", {}, 1, 60.0)
        await store.add_command(command, NOW)
    await store.request_cancel("c2", NOW)  # cancelled at once: no longer counted
    assert await store.active_command_counts() == {"prod": {"pending": 2}}


async def test_audit_search_by_every_filter(store: Store) -> None:
    def event(minute: int, verb: str, status: int, user: str = "ann") -> AuditEvent:
        return AuditEvent(
            None, NOW + timedelta(minutes=minute), user, "prod", "proxy", verb, status=status
        )

    await store.add_audit_events(
        [event(0, "get", 200), event(1, "list", 200), event(2, "get", 403, "bob")]
    )
    found = await store.search_audit(AuditQuery(verb="get"))
    assert [(e.user, e.status) for e in found] == [("bob", 403), ("ann", 200)]
    assert [e.user for e in await store.search_audit(AuditQuery(status=403))] == ["bob"]
    window = AuditQuery(since=NOW + timedelta(minutes=1), until=NOW + timedelta(minutes=2))
    assert [e.verb for e in await store.search_audit(window)] == ["list"]
    assert len(await store.search_audit(AuditQuery(kind="proxy", limit=2))) == 2
    assert await store.search_audit(AuditQuery(cluster="dev")) == []
