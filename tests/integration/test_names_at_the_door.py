"""Names every agent would refuse are refused where they are made, saying why.

Found in review: ``user add`` and ``grant --as-group`` accepted ``system``,
``systemd`` and ``system-masters``; every request such a user made was then
refused by the agent with a misleading "identity ... is outside tunnel:". And
names were checked with a pattern that let one final newline through.
"""

from __future__ import annotations

import pytest

from .harness import RunningServer

REFUSED = ["system", "systemd", "system-masters", "eve\n", "Eve", "-eve", ""]


@pytest.mark.parametrize("name", [name for name in REFUSED if name])  # "": a missing name
async def test_a_user_with_a_name_no_agent_accepts_is_not_added(
    server: RunningServer, name: str
) -> None:
    status, answer = await server.api("POST", "/api/v1/users", {"name": name, "groups": []})
    assert status == 400
    message = answer["error"]["message"]
    assert "is not allowed" in message
    assert "not beginning with 'system'" in message  # what is allowed, said each time
    status, users = await server.api("GET", "/api/v1/users")
    assert name not in [user["name"] for user in users]


async def test_a_system_name_is_refused_with_the_reason(server: RunningServer) -> None:
    status, answer = await server.api("POST", "/api/v1/users", {"name": "systemd", "groups": []})
    assert status == 400
    assert (
        "every agent refuses identities beginning with tunnel:system"
        in (answer["error"]["message"])
    )


@pytest.mark.parametrize("group", REFUSED)
async def test_a_user_in_a_group_no_agent_accepts_is_not_added(
    server: RunningServer, group: str
) -> None:
    status, answer = await server.api("POST", "/api/v1/users", {"name": "eve", "groups": [group]})
    assert status == 400
    assert "is not allowed" in answer["error"]["message"]


@pytest.mark.parametrize("group", REFUSED)
async def test_a_grant_as_a_group_no_agent_accepts_is_not_made(
    server: RunningServer, group: str
) -> None:
    await server.add_cluster("prod")
    status, _ = await server.api("POST", "/api/v1/users", {"name": "eve", "groups": []})
    assert status == 201
    status, answer = await server.api("PUT", "/api/v1/grants/eve/prod", {"as_groups": [group]})
    assert status == 400
    assert "is not allowed" in answer["error"]["message"]
    status, grants = await server.api("GET", "/api/v1/grants?user=eve")
    assert grants == []


async def test_names_that_merely_contain_system_are_fine(server: RunningServer) -> None:
    for name in ("ops-system", "filesystem"):
        status, answer = await server.api("POST", "/api/v1/users", {"name": name, "groups": []})
        assert status == 201, answer
