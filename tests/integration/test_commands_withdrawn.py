"""A command waiting for its agent stops when its submitter loses access (found by a review:
a deleted user's pending command ran once the agent came)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .commands_support import Script, command, command_agent
from .harness import RunningServer, agent_settings
from .test_api_lapsed_access import user_with_token
from .test_commands_delivery import until_state


@pytest.mark.parametrize("withdrawal", ["/api/v1/users/alice", "/api/v1/grants/alice/prod"])
async def test_a_pending_command_is_withdrawn_when_its_submitter_loses_access(
    server: RunningServer, tmp_path: Path, withdrawal: str
) -> None:
    token = await server.add_cluster("prod")
    alice = await user_with_token(server, "alice", grant={"commands": True})
    status, pending = await server.api(
        "POST", "/api/v1/clusters/prod/commands", {"spec": command("ok-while-away")}, token=alice
    )
    assert (status, pending["state"]) == (201, "pending")  # no agent yet
    status, _ = await server.api("DELETE", withdrawal)
    assert status in (200, 204)
    script = Script()
    status, admins = await server.api(
        "POST", "/api/v1/clusters/prod/commands", {"spec": command("ok-admins")}
    )
    assert status == 201
    async with command_agent(agent_settings(server, "prod", token, tmp_path / "creds"), script) as (
        agent,
        _,
    ):
        await agent.wait_connected()
        withdrawn = await until_state(server, pending["id"], "cancelled", "succeeded")
        await until_state(server, admins["id"], "succeeded")
    assert withdrawn["state"] == "cancelled"
    assert withdrawn["error"] == (
        "cancelled before delivery: alice may no longer send commands to prod"
        " (the user was deleted or the grant withdrawn)"
    )
    assert [run[0] for run in script.runs] == [admins["id"]]
