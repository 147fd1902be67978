"""The live proxied requests, and the check that ends those access no longer allows.

:class:`LiveRequests` is tested with its check (``refusal``) and streams
standing in: what it decides is which streams to reset, and when. The check
itself, :func:`access_refusal`, runs against the real server's store and
access cache. kubectl's view of it is in tests/e2e/test_kubectl_revocation.py.
"""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from protocol.kinds import HTTP_ACCESS_REVOKED
from tunnel_mux import MuxStream
from tunnel_server.access import AccessCache
from tunnel_server.live_access import Credential, LiveRequests
from tunnel_server.proxyrequest import ProxyExchange, access_refusal
from tunnel_server.store.base import Store, StoreError, User, hash_token

from ..e2e import test_kubectl_tunnel as kubectl_e2e
from ..integration.harness import RunningServer
from ..support import until

server = kubectl_e2e.server


class Stream:
    """What LiveRequests uses of a stream: a key, and ``reset``."""

    def __init__(self) -> None:
        self.resets: list[tuple[int, str]] = []

    def reset(self, code: int, reason: str = "") -> None:
        self.resets.append((code, reason))


def stream() -> tuple[Stream, MuxStream]:
    fake = Stream()
    return fake, cast(MuxStream, fake)


def exchange() -> ProxyExchange:
    return ProxyExchange("prod-eu", "GET")


def credential(token: str = "token", cluster: str = "prod-eu") -> Credential:
    return Credential(hash_token(token), cluster, (), (("impersonate-user", "tunnel:alice"),))


class Refusals:
    """A check whose answer per credential the test sets; it counts its calls."""

    def __init__(self) -> None:
        self.refused: dict[Credential, str] = {}
        self.calls: list[Credential] = []

    async def __call__(self, credential: Credential) -> str | None:
        self.calls.append(credential)
        return self.refused.get(credential)


def live_requests(refusals: Refusals, interval: float = 3600.0) -> LiveRequests:
    # The access cache is only invalidated and read for its generation here.
    return LiveRequests(AccessCache(cast(Store, None)), refusals, interval=interval)


async def test_a_check_ends_the_requests_of_a_refused_credential_and_no_others() -> None:
    refusals = Refusals()
    live = live_requests(refusals)
    revoked, kept = credential("old"), credential("new")
    (gone, gone_stream), (staying, staying_stream) = stream(), stream()
    live.add(gone_stream, revoked, 0, exchange())
    live.add(staying_stream, kept, 0, exchange())
    refusals.refused[revoked] = "the caller's API token was revoked, or its user deleted"

    assert await live.check() == 1

    assert gone.resets == [
        (HTTP_ACCESS_REVOKED, "the caller's API token was revoked, or its user deleted")
    ]
    assert staying.resets == []
    assert len(live) == 1  # the ended request is no longer held


async def test_the_requests_of_one_credential_are_checked_once() -> None:
    refusals = Refusals()
    live = live_requests(refusals)
    shared = credential()
    for _ in range(3):
        live.add(stream()[1], shared, 0, exchange())

    await live.check()

    assert refusals.calls == [shared]


async def test_a_request_that_ends_while_its_credential_is_checked_is_not_reset() -> None:
    answering = asyncio.Event()

    async def slow_refusal(credential: Credential) -> str | None:
        await answering.wait()
        return "revoked"

    live = LiveRequests(AccessCache(cast(Store, None)), slow_refusal, interval=3600.0)
    fake, mux_stream = stream()
    live.add(mux_stream, credential(), 0, exchange())
    checking = asyncio.create_task(live.check())
    await until(lambda: len(live) == 1 and not answering.is_set())
    live.discard(mux_stream)  # the request ended meanwhile
    answering.set()

    assert await checking == 0
    assert fake.resets == []


async def test_a_change_of_access_forgets_the_cached_answers_before_checking() -> None:
    refusals = Refusals()
    live = live_requests(refusals)
    access = live._access
    before = access.generation
    live.add(stream()[1], credential(), before, exchange())

    await live.access_changed()

    assert access.generation == before + 1
    assert refusals.calls == [credential()]


async def test_a_request_let_through_before_a_change_is_checked_again_soon() -> None:
    # Its answers were read before the change, and it was added after the
    # check that went with the change: that check could not see it.
    refusals = Refusals()
    live = live_requests(refusals)
    old_generation = live._access.generation
    live._access.invalidate()
    refusals.refused[credential()] = "revoked"
    fake, mux_stream = stream()
    async with live.running():
        live.add(mux_stream, credential(), old_generation, exchange())
        await until(lambda: fake.resets != [])
    assert fake.resets == [(HTTP_ACCESS_REVOKED, "revoked")]


async def test_a_request_let_through_with_current_answers_waits_for_the_periodic_check() -> None:
    refusals = Refusals()
    live = live_requests(refusals)
    async with live.running():
        live.add(stream()[1], credential(), live._access.generation, exchange())
        for _ in range(1000):
            await asyncio.sleep(0)
    assert refusals.calls == []


async def test_the_periodic_check_ends_requests_whose_access_changed_elsewhere() -> None:
    refusals = Refusals()
    live = live_requests(refusals, interval=0.01)
    fake, mux_stream = stream()
    live.add(mux_stream, credential(), live._access.generation, exchange())
    async with live.running():
        # Another replica revoked it: nothing on this server said so.
        refusals.refused[credential()] = "revoked elsewhere"
        await until(lambda: fake.resets != [], max_turns=10**7)
    assert fake.resets == [(HTTP_ACCESS_REVOKED, "revoked elsewhere")]


# ---------------------------------------------------------------- the check


async def alice(server: RunningServer, grant: dict[str, object]) -> tuple[Credential, str]:
    """A user alice granted prod-eu with ``grant``, and the credential of her request now."""
    await server.add_cluster("prod-eu")
    status, answer = await server.api(
        "POST", "/api/v1/users", {"name": "alice", "groups": ["platform"]}
    )
    assert status == 201
    token: str = answer["token"]
    status, _ = await server.api("PUT", "/api/v1/grants/alice/prod-eu", grant)
    assert status == 200
    identity = (("impersonate-user", "tunnel:alice"), ("impersonate-group", "tunnel:platform"))
    return Credential(hash_token(token), "prod-eu", (), identity), token


async def test_the_check_lets_a_credential_through_while_nothing_changed(
    server: RunningServer,
) -> None:
    credential, _ = await alice(server, {})
    assert await access_refusal(server.context.access, credential) is None


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ("/api/v1/users/alice/tokens", "the caller's API token was revoked, or its user deleted"),
        ("/api/v1/users/alice", "the caller's API token was revoked, or its user deleted"),
        ("/api/v1/grants/alice/prod-eu", "user alice no longer has a grant on cluster prod-eu"),
    ],
)
async def test_the_check_refuses_a_credential_whose_token_user_or_grant_is_gone(
    server: RunningServer, change: str, reason: str
) -> None:
    credential, _ = await alice(server, {})
    status, _ = await server.api("DELETE", change)
    assert status == 200
    assert await access_refusal(server.context.access, credential) == reason


async def test_the_check_refuses_a_credential_whose_identity_changed(
    server: RunningServer,
) -> None:
    credential, _ = await alice(server, {})
    await server.api("PUT", "/api/v1/grants/alice/prod-eu", {"as_groups": ["view-only"]})
    assert (
        await access_refusal(server.context.access, credential)
        == "the identity of user alice on cluster prod-eu changed"
    )


async def test_the_check_refuses_a_callers_own_impersonation_once_the_grant_stops_allowing_it(
    server: RunningServer,
) -> None:
    allowed, _ = await alice(server, {"impersonate": True})
    requested = (("impersonate-user", "bob"),)
    credential = Credential(
        allowed.token_hash, "prod-eu", requested, (("impersonate-user", "tunnel:bob"),)
    )
    assert await access_refusal(server.context.access, credential) is None
    await server.api("PUT", "/api/v1/grants/alice/prod-eu", {"impersonate": False})
    refusal = await access_refusal(server.context.access, credential)
    assert refusal is not None
    assert "may not impersonate on this cluster" in refusal


async def test_a_store_that_cannot_be_read_refuses_nothing(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    credential, _ = await alice(server, {})
    access = server.context.access

    async def unreadable(token_hash: str) -> tuple[float, User | None]:
        raise StoreError("the state store is locked")

    monkeypatch.setattr(access, "lookup_user_by_hash", unreadable)
    assert await access_refusal(access, credential) is None
