"""The live proxied requests, and the check that ends those access no longer allows.

:class:`LiveRequests` is tested with its check (``refusal``) and streams
standing in: what it decides is which streams to reset, and when. The check
itself, :func:`access_refusal`, runs against the real server's store and
access cache. kubectl's view of it is in tests/e2e/test_kubectl_revocation.py.
"""

from __future__ import annotations

import asyncio
import json
from typing import cast

import pytest

from protocol.errors import ErrorCode
from protocol.kinds import HTTP_ACCESS_REVOKED
from tunnel_mux import MuxStream, SessionClosedError, SessionError, StreamResetError
from tunnel_server.access.cache import AccessCache
from tunnel_server.proxy.credential import Credential
from tunnel_server.proxy.exchange import ProxyExchange
from tunnel_server.proxy.identity import access_refusal
from tunnel_server.proxy.live_requests import LiveRequests
from tunnel_server.proxy.refusal import dropped_refusal, revocation_event
from tunnel_server.store.base import Store, StoreError, User, hash_token

from ...e2e import test_kubectl_tunnel as kubectl_e2e
from ...integration.harness import RunningServer
from ...support import until

server = kubectl_e2e.server


class Stream:
    """What LiveRequests uses of a stream: a key, ``error`` and ``reset``."""

    def __init__(self) -> None:
        self.error: Exception | None = None
        self.resets: list[tuple[int, str]] = []

    def reset(self, code: int, reason: str = "") -> None:
        self.resets.append((code, reason))


def stream() -> tuple[Stream, MuxStream]:
    fake = Stream()
    return fake, cast(MuxStream, fake)


def exchange() -> ProxyExchange:
    return ProxyExchange("prod-eu", "GET")


def credential(token: str = "token", user: str = "alice", cluster: str = "prod-eu") -> Credential:
    identity = frozenset({("impersonate-user", f"tunnel:{user}")})
    return Credential(hash_token(token), user, cluster, (), identity)


class Refusals:
    """The check, as the test sets it per credential; it records each call.

    Each call waits while :attr:`gate` is clear, and raises :attr:`failure`
    if one is set.
    """

    def __init__(self, access: AccessCache) -> None:
        self.access = access
        self.refused: dict[Credential, str] = {}
        self.calls: list[Credential] = []
        #: The access generation each call saw.
        self.generations: list[int] = []
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()
        self.gate.set()
        self.failure: Exception | None = None

    async def __call__(self, credential: Credential) -> str | None:
        self.calls.append(credential)
        self.generations.append(self.access.generation)
        self.entered.set()
        await self.gate.wait()
        if self.failure is not None:
            raise self.failure
        return self.refused.get(credential)


def live_requests(interval: float = 3600.0) -> tuple[LiveRequests, AccessCache, Refusals]:
    # The access cache is only invalidated and read for its generation here.
    access = AccessCache(cast(Store, None))
    refusals = Refusals(access)
    return LiveRequests(access, refusals, interval=interval), access, refusals


async def test_a_check_ends_the_requests_of_a_refused_credential_and_no_others() -> None:
    live, _, refusals = live_requests()
    revoked, kept = credential("old"), credential("new")
    (gone, gone_stream), (staying, staying_stream) = stream(), stream()
    live.add(gone_stream, revoked, 0, exchange())
    live.add(staying_stream, kept, 0, exchange())
    refusals.refused[revoked] = (
        "the caller's API token expired or was revoked, or its user was deleted"
    )

    assert await live.check() == 1

    assert gone.resets == [
        (
            HTTP_ACCESS_REVOKED,
            "the caller's API token expired or was revoked, or its user was deleted",
        )
    ]
    assert staying.resets == []
    assert len(live) == 1  # the ended request is no longer held


async def test_requests_in_progress_are_counted_per_user_and_cluster() -> None:
    live, _, refusals = live_requests()
    (_, first), (_, second), (_, elsewhere), (_, bobs) = (stream() for _ in range(4))
    live.add(first, credential("a"), 0, exchange())
    live.add(second, credential("b"), 0, exchange())  # another token of alice's
    live.add(elsewhere, credential("a", cluster="staging"), 0, exchange())
    live.add(bobs, credential("c", user="bob"), 0, exchange())
    assert (live.count("alice", "prod-eu"), live.count("alice", "staging")) == (2, 1)
    assert live.count("bob", "prod-eu") == 1

    live.discard(first)
    live.discard(first)  # twice: counted once
    assert live.count("alice", "prod-eu") == 1
    refusals.refused[credential("b")] = "revoked"
    await live.check()  # ends the second
    assert live.count("alice", "prod-eu") == 0
    assert (live.count("alice", "staging"), live.count("bob", "prod-eu")) == (1, 1)


async def test_the_requests_of_one_credential_are_checked_once() -> None:
    live, _, refusals = live_requests()
    shared = credential()
    for _ in range(3):
        live.add(stream()[1], shared, 0, exchange())

    await live.check()

    assert refusals.calls == [shared]


async def test_a_request_that_ends_while_its_credential_is_checked_is_not_reset() -> None:
    live, _, refusals = live_requests()
    refusals.refused[credential()] = "revoked"
    refusals.gate.clear()
    fake, mux_stream = stream()
    live.add(mux_stream, credential(), 0, exchange())
    checking = asyncio.create_task(live.check())
    await refusals.entered.wait()  # the check took its list, and is asking
    live.discard(mux_stream)  # the request ended meanwhile
    refusals.gate.set()

    assert await checking == 0
    assert fake.resets == []


async def test_a_request_whose_stream_already_failed_is_neither_reset_nor_counted() -> None:
    # Its agent went away (a cluster deleted): it is ending, and was not revoked.
    live, _, refusals = live_requests()
    refusals.refused[credential()] = "revoked"
    fake, mux_stream = stream()
    fake.error = ConnectionResetError("the session closed")
    live.add(mux_stream, credential(), 0, exchange())

    assert await live.check() == 0

    assert fake.resets == []
    assert len(live) == 1  # its owner discards it as it ends


async def test_a_change_of_access_forgets_the_cached_answers_before_checking() -> None:
    live, access, refusals = live_requests()
    before = access.generation
    live.add(stream()[1], credential(), before, exchange())

    await live.access_changed()

    assert refusals.generations == [before + 1]


async def test_a_change_checks_only_the_requests_of_the_user_or_cluster_it_names() -> None:
    live, _, refusals = live_requests()
    alices, bobs = credential(user="alice"), credential("bob's", user="bob")
    on_staging = credential(cluster="staging")
    for each in (alices, bobs, on_staging):
        live.add(stream()[1], each, 0, exchange())

    await live.access_changed(user="bob")
    assert refusals.calls == [bobs]
    await live.access_changed(user="alice", cluster="staging")
    assert refusals.calls == [bobs, on_staging]


async def test_a_change_whose_check_was_cancelled_is_finished_by_the_periodic_check() -> None:
    # The admin's API call went away while its check was waiting on the store.
    live, access, refusals = live_requests()
    fake, mux_stream = stream()
    live.add(mux_stream, credential(), access.generation, exchange())
    refusals.refused[credential()] = "revoked"
    refusals.gate.clear()
    async with live.running():
        changing = asyncio.create_task(live.access_changed())
        await refusals.entered.wait()
        changing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await changing
        refusals.gate.set()
        await until(lambda: fake.resets != [])
    assert fake.resets == [(HTTP_ACCESS_REVOKED, "revoked")]


async def test_a_request_let_through_before_a_change_is_checked_again_soon() -> None:
    # Its answers were read before the change, and it was added after the
    # check that went with the change: that check could not see it.
    live, access, refusals = live_requests()
    old_generation = access.generation
    access.invalidate()
    refusals.refused[credential()] = "revoked"
    fake, mux_stream = stream()
    async with live.running():
        live.add(mux_stream, credential(), old_generation, exchange())
        await until(lambda: fake.resets != [])
    assert fake.resets == [(HTTP_ACCESS_REVOKED, "revoked")]


async def test_a_request_let_through_with_current_answers_waits_for_the_periodic_check() -> None:
    live, access, refusals = live_requests()
    async with live.running():
        live.add(stream()[1], credential(), access.generation, exchange())
        for _ in range(1000):
            await asyncio.sleep(0)
    assert refusals.calls == []


async def test_the_periodic_check_ends_requests_whose_access_changed_elsewhere() -> None:
    live, access, refusals = live_requests(interval=0.0)  # every turn: no timer to wait for
    fake, mux_stream = stream()
    live.add(mux_stream, credential(), access.generation, exchange())
    async with live.running():
        # Another replica revoked it: nothing on this server said so.
        refusals.refused[credential()] = "revoked elsewhere"
        await until(lambda: fake.resets != [])
    assert fake.resets == [(HTTP_ACCESS_REVOKED, "revoked elsewhere")]


async def test_a_store_that_cannot_be_read_ends_nothing_and_is_reported_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    live, _, refusals = live_requests()
    refusals.failure = StoreError("the state store is locked")
    streams = [stream() for _ in range(2)]
    for (_, mux_stream), token in zip(streams, ("one", "two"), strict=True):
        live.add(mux_stream, credential(token), 0, exchange())

    assert await live.check() == 0

    assert all(fake.resets == [] for fake, _ in streams)
    [warning] = [r for r in caplog.records if r.name == "tunnel_server.proxy.live_requests"]
    assert "2 credential(s)" in warning.getMessage()
    assert "the state store is locked" in warning.getMessage()


async def test_the_periodic_check_goes_on_after_a_check_fails(
    caplog: pytest.LogCaptureFixture,
) -> None:
    live, access, refusals = live_requests(interval=0.0)
    refusals.failure = RuntimeError("a bug")
    fake, mux_stream = stream()
    live.add(mux_stream, credential(), access.generation, exchange())
    refusals.refused[credential()] = "revoked"
    async with live.running():
        await until(lambda: any("checking the live requests failed" in r.message
                                for r in caplog.records))  # fmt: skip
        refusals.failure = None
        await until(lambda: fake.resets != [])
    assert fake.resets == [(HTTP_ACCESS_REVOKED, "revoked")]


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
    identity = frozenset(
        {("impersonate-user", "tunnel:alice"), ("impersonate-group", "tunnel:platform")}
    )
    return Credential(hash_token(token), "alice", "prod-eu", (), identity), token


async def test_the_check_lets_a_credential_through_while_nothing_changed(
    server: RunningServer,
) -> None:
    credential, _ = await alice(server, {})
    assert await access_refusal(server.context.access, credential) is None


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (
            "/api/v1/users/alice/tokens",
            "the caller's API token expired or was revoked, or its user was deleted",
        ),
        (
            "/api/v1/users/alice",
            "the caller's API token expired or was revoked, or its user was deleted",
        ),
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
        allowed.token_hash,
        "alice",
        "prod-eu",
        requested,
        frozenset({("impersonate-user", "tunnel:bob")}),
    )
    assert await access_refusal(server.context.access, credential) is None
    await server.api("PUT", "/api/v1/grants/alice/prod-eu", {"impersonate": False})
    refusal = await access_refusal(server.context.access, credential)
    assert refusal is not None
    assert "may not impersonate on this cluster" in refusal


async def test_the_check_reports_a_store_that_cannot_be_read_rather_than_refusing(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    credential, _ = await alice(server, {})
    access = server.context.access

    async def unreadable(token_hash: str) -> tuple[float, User | None]:
        raise StoreError("the state store is locked")

    monkeypatch.setattr(access, "lookup_user_by_hash", unreadable)
    with pytest.raises(StoreError):
        await access_refusal(access, credential)


async def test_the_check_lets_a_grant_change_through_when_the_identity_is_the_same(
    server: RunningServer,
) -> None:
    credential, _ = await alice(server, {"as_groups": ["view", "ops"]})
    credential = Credential(
        credential.token_hash,
        "alice",
        "prod-eu",
        (),
        credential.identity
        | {("impersonate-group", "tunnel:view"), ("impersonate-group", "tunnel:ops")},
    )
    # The same groups in another order, and the right to dispatch commands.
    await server.api(
        "PUT", "/api/v1/grants/alice/prod-eu", {"as_groups": ["ops", "view"], "commands": True}
    )
    assert await access_refusal(server.context.access, credential) is None


# ---------------------------------------------------------------- what the caller is told

JSON = (("content-type", "application/json"),)


def revoked(reason: str = "user alice no longer has a grant on cluster prod-eu") -> SessionError:
    return StreamResetError(HTTP_ACCESS_REVOKED, reason, remote=False)


def watch_exchange() -> ProxyExchange:
    watching = ProxyExchange("prod-eu", "GET")
    watching.verb = "watch"
    return watching


def test_a_revoked_json_watch_ends_with_the_api_servers_error_event() -> None:
    event = revocation_event(revoked(), watch_exchange().verb, JSON, between_events=True)

    assert event is not None
    assert event.endswith(b"\n")
    decoded = json.loads(event)
    assert decoded["type"] == "ERROR"
    assert decoded["object"]["kind"] == "Status"
    assert (decoded["object"]["code"], decoded["object"]["reason"]) == (403, "Forbidden")
    assert decoded["object"]["message"] == (
        "access revoked: user alice no longer has a grant on cluster prod-eu"
    )


@pytest.mark.parametrize(
    ("error", "verb", "headers", "between_events"),
    [
        # Half an event was sent: an event after it would not decode.
        (revoked(), "watch", JSON, False),
        # Not a revocation: the agent's reset, another code, a closed session.
        (StreamResetError(HTTP_ACCESS_REVOKED, "x", remote=True), "watch", JSON, True),
        (StreamResetError(ErrorCode.CANCEL, "x", remote=False), "watch", JSON, True),
        (SessionClosedError("the agent went away"), "watch", JSON, True),
        # Not a JSON watch.
        (revoked(), "get", JSON, True),
        (
            revoked(),
            "watch",
            (("content-type", "application/vnd.kubernetes.protobuf;stream=watch"),),
            True,
        ),
    ],
)
def test_any_other_end_is_cut_without_an_event(
    error: SessionError, verb: str, headers: tuple[tuple[str, str], ...], between_events: bool
) -> None:
    exchange = watch_exchange()
    exchange.verb = verb
    assert revocation_event(error, exchange.verb, headers, between_events) is None


def test_a_request_revoked_before_its_answer_is_refused_with_403_and_why() -> None:
    refusal = dropped_refusal(revoked("the caller's API token was revoked"), "prod-eu")
    assert (refusal.code, refusal.reason) == (403, "Forbidden")
    assert refusal.message == "access revoked: the caller's API token was revoked"
    dropped = dropped_refusal(SessionClosedError("the socket closed"), "prod-eu")
    assert (dropped.code, dropped.reason) == (502, "BadGateway")
    assert dropped.message.startswith("cluster prod-eu dropped the request: ")
