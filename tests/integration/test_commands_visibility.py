"""Who sees which commands: a user's own, in full pages; others' not even confirmed.

Found by a review of the command path: a non-admin's page was filled with others' commands
before the filter ran (so it came back empty), another user's command answered 403 where a
missing one answered 404, and every listing decoded every spec (up to 1 MiB each) only to
drop it.
"""

from __future__ import annotations

from typing import Any

import pytest

from .commands_support import command
from .harness import RunningServer
from .test_api_lapsed_access import user_with_token


async def submit(server: RunningServer, name: str, token: str | None = None) -> dict[str, Any]:
    status, answer = await server.api(
        "POST", "/api/v1/clusters/prod/commands", {"spec": command(name)}, token=token
    )
    assert status == 201, answer
    result: dict[str, Any] = answer
    return result


@pytest.fixture
async def alice(server: RunningServer) -> str:
    await server.add_cluster("prod")
    return await user_with_token(server, "alice", grant={"commands": True})


async def test_a_users_page_holds_their_own_commands_however_many_others_wrote(
    server: RunningServer, alice: str
) -> None:
    mine = await submit(server, "alice-one", alice)
    for number in range(3):
        await submit(server, f"admin-{number}")
    status, listed = await server.api("GET", "/api/v1/commands?limit=2", token=alice)
    assert status == 200
    assert [item["id"] for item in listed] == [mine["id"]]
    status, everything = await server.api("GET", "/api/v1/commands?limit=2")
    assert [item["name"] for item in everything] == ["admin-2", "admin-1"]


@pytest.mark.parametrize(("method", "suffix"), [("GET", ""), ("GET", "/logs"), ("POST", "/cancel")])
async def test_another_users_command_is_answered_as_one_that_does_not_exist(
    server: RunningServer, alice: str, method: str, suffix: str
) -> None:
    bob = await user_with_token(server, "bob", grant={"commands": True})
    theirs = await submit(server, "alice-one", alice)
    missing = "00000000-0000-4000-8000-000000000000"
    answers = []
    for command_id in (theirs["id"], missing):
        status, answer = await server.api(
            method, f"/api/v1/commands/{command_id}{suffix}", token=bob
        )
        answers.append((status, answer["error"]["code"], answer["error"]["message"]))
    hint = "none was submitted with this id, or it finished more than 30d ago and was deleted"
    assert answers == [
        (404, "not_found", f"no command {theirs['id']!r}: {hint} (--command-retention)"),
        (404, "not_found", f"no command {missing!r}: {hint} (--command-retention)"),
    ]
    status, still = await server.api("GET", f"/api/v1/commands/{theirs['id']}")
    assert (status, still["state"]) == (200, "pending")  # bob's cancel did nothing


@pytest.mark.parametrize("limit", ["0", "-1", "1001", "1e3", "many"])
async def test_a_listing_limit_out_of_range_is_refused(
    server: RunningServer, alice: str, limit: str
) -> None:
    status, answer = await server.api("GET", f"/api/v1/commands?limit={limit}", token=alice)
    assert status == 400
    assert answer["error"]["message"] == f"limit must be a number from 1 to 1000, not {limit!r}"


async def test_a_listing_leaves_the_specs_in_the_store(server: RunningServer, alice: str) -> None:
    created = await submit(server, "alice-one", alice)
    [listed] = await server.context.store.list_commands(submitter="alice")
    assert listed.spec == {}
    full = await server.context.store.get_command(created["id"])
    assert full.spec["name"] == "alice-one"
