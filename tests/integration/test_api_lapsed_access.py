"""The REST API acts on a caller's word only while that word still stands.

Found in review: a handler checked the caller's token when the request head
came, then read the body (up to 30 s) and acted; a token minted for a caller
being revoked outlived the revocation; an idempotency key answered with
another user's command; a kubeconfig request told non-admins which clusters
exist; and a caller's ``--as tunnel:system:...`` reached the agent.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from ..tunnel_server.frontdoor_support import PREFIX, Reply, caller, request
from .commands_support import command
from .harness import RunningServer


async def user_with_token(
    server: RunningServer, name: str, *, admin: bool = False, grant: dict[str, Any] | None = None
) -> str:
    status, answer = await server.api(
        "POST", "/api/v1/users", {"name": name, "groups": [], "admin": admin}
    )
    assert status == 201, answer
    if grant is not None:
        status, _ = await server.api("PUT", f"/api/v1/grants/{name}/prod", grant)
        assert status == 200
    token: str = answer["token"]
    return token


async def body_after(
    server: RunningServer, path: str, token: str, body: Any, meanwhile: str
) -> Reply:
    """POST ``body`` as JSON, head first; the admin DELETEs ``meanwhile`` before the rest."""
    sent = request(
        "POST", path, token, "Content-Type: application/json", body=json.dumps(body).encode()
    )
    head, rest = sent.split(b"\r\n\r\n", 1)
    async with caller(server) as connection:
        connection.send(head + b"\r\n\r\n")
        # The caller was checked when the head came.
        status, _ = await server.api("DELETE", meanwhile)
        assert status == 200
        connection.send(rest)
        return await connection.reply()


async def test_a_change_whose_body_comes_after_the_callers_deletion_is_not_made(
    server: RunningServer,
) -> None:
    ops = await user_with_token(server, "ops", admin=True)
    backdoor = {"name": "backdoor", "admin": True}
    reply = await body_after(server, "/api/v1/users", ops, backdoor, "/api/v1/users/ops")
    assert reply.status == 401
    status, users = await server.api("GET", "/api/v1/users")
    assert status == 200
    assert "backdoor" not in [user["name"] for user in users]


async def test_a_command_whose_body_comes_after_its_grant_went_is_not_queued(
    server: RunningServer,
) -> None:
    await server.add_cluster("prod")
    dev = await user_with_token(server, "dev", grant={"commands": True})
    path, spec = "/api/v1/clusters/prod/commands", command("after-ungrant")
    reply = await body_after(server, path, dev, spec, "/api/v1/grants/dev/prod")
    assert reply.status == 403
    status, queued = await server.api("GET", "/api/v1/commands")
    assert (status, queued) == (200, [])


@pytest.fixture
async def bob(server: RunningServer) -> str:
    """The token of bob, who has a grant on cluster prod."""
    await server.add_cluster("prod")
    return await user_with_token(server, "bob", grant={})


async def test_a_token_minted_while_the_callers_is_revoked_goes_with_it(
    server: RunningServer, bob: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = server.context.store
    add_api_token = store.add_api_token
    minted: list[str] = []

    async def revoked_meanwhile(token_hash: str, *args: Any, **kwargs: Any) -> Any:
        # The revocation lands between the new token's write and the answer.
        added = await add_api_token(token_hash, *args, **kwargs)
        minted.append(token_hash)
        status, _ = await server.api("DELETE", "/api/v1/users/bob/tokens")
        assert status == 200
        return added

    monkeypatch.setattr(store, "add_api_token", revoked_meanwhile)
    status, answer = await server.api(
        "POST", "/api/v1/users/bob/kubeconfig?cluster=prod", token=bob
    )
    assert (status, answer["error"]["code"]) == (401, "token_invalid")
    assert len(minted) == 1
    assert await store.find_user_by_token(minted[0]) is None


async def test_a_token_gone_from_the_store_is_not_read_as_one_that_never_expires(
    server: RunningServer, bob: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = server.context.store

    async def none_left(user: str) -> list[Any]:
        return []  # revoked after the request was let in

    monkeypatch.setattr(store, "list_api_tokens", none_left)
    status, answer = await server.api(
        "POST", "/api/v1/users/bob/kubeconfig?cluster=prod&ttl=8760h", token=bob
    )
    assert (status, answer["error"]["code"]) == (401, "token_invalid")


async def test_an_idempotency_key_never_answers_with_another_users_command(
    server: RunningServer,
) -> None:
    await server.add_cluster("prod")
    mallory = await user_with_token(server, "mallory", grant={"commands": True})

    async def submit(name: str, token: str | None = None) -> tuple[int, Any]:
        body = {"spec": command(name), "idempotency_key": "nightly"}
        return await server.api("POST", "/api/v1/clusters/prod/commands", body, token=token)

    status, first = await submit("mallory-thing", mallory)
    assert status == 201
    # Each submitter's keys are their own: mallory's neither blocks nor answers the admin.
    status, admins = await submit("admin-release")
    assert status == 201
    assert admins["id"] != first["id"]
    assert "mallory" not in json.dumps(admins)
    status, again = await submit("admin-release")
    assert (status, again["id"]) == (200, admins["id"])
    # Nor does the same user's different command pass as a retry; the same one does.
    status, _ = await submit("other-thing", mallory)
    assert status == 409
    status, again = await submit("mallory-thing", mallory)
    assert (status, again["id"]) == (200, first["id"])


async def test_a_user_without_a_grant_learns_nothing_of_which_clusters_exist(
    server: RunningServer,
) -> None:
    await server.add_cluster("prod-secret")
    eve = await user_with_token(server, "eve")
    answers = []
    for cluster in ("prod-secret", "staging"):
        status, answer = await server.api(
            "POST", f"/api/v1/users/eve/kubeconfig?cluster={cluster}", token=eve
        )
        answers.append((status, answer["error"]["code"]))
    assert answers == [(403, "not_granted"), (403, "not_granted")]
    submissions = []
    for cluster in ("prod-secret", "staging"):
        status, answer = await server.api(
            "POST", f"/api/v1/clusters/{cluster}/commands", {"spec": command("x")}, token=eve
        )
        submissions.append((status, answer["error"]["code"]))
    assert submissions == [(403, "commands_not_granted"), (403, "commands_not_granted")]


async def test_impersonating_a_tunnel_system_identity_is_refused_by_the_server(
    server: RunningServer,
) -> None:
    await server.add_cluster("prod")
    dev = await user_with_token(server, "dev", grant={"impersonate": True})
    pods = f"{PREFIX.replace('prod-eu', 'prod')}/api/v1/pods"
    async with caller(server) as connection:
        connection.send(request("GET", pods, dev, "Impersonate-User: tunnel:system:masters"))
        reply = await connection.reply()
    # Refused here, before any agent is asked (none is connected: that would be 503).
    assert reply.status == 403
    assert "cannot be impersonated" in reply.json()["message"]
