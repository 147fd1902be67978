"""Races between the server giving up on an attempt and the agent about to run it.

The command ran although the server had cancelled it (found by a review of the command
path); tests/tunnel_agent/test_runner.py has the agent's side, an attempt found stale while
queued. The agent runs one command at a time here: a
``gate-*`` command holds the worker while the race plays out, and a last command queued behind
the others proves, by finishing, that the worker has passed the attempt in question.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from protocol import kinds
from tunnel_agent.runner import CommandRunner

from .commands_support import Script, command, command_agent
from .harness import agent_settings, running_server, server_settings
from .test_commands_delivery import submit, until_state


async def test_a_command_cancelled_while_the_agent_accepts_it_does_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    offered, release = asyncio.Event(), asyncio.Event()
    accept = CommandRunner.handle_offer

    async def slow_to_answer(self: CommandRunner, stream: Any) -> None:
        if stream.headers.get("name") == "ok-raced":
            offered.set()
            await release.wait()  # the agent's "accepted" is on its way over a slow link
        await accept(self, stream)

    cancels: list[dict[str, Any]] = []
    told = asyncio.Event()
    on_message = CommandRunner.on_message

    def watched(self: CommandRunner, kind: str, body: dict[str, Any]) -> None:
        on_message(self, kind, body)
        if kind == kinds.MESSAGE_COMMAND_CANCEL:
            cancels.append(body)
            told.set()

    monkeypatch.setattr(CommandRunner, "handle_offer", slow_to_answer)
    monkeypatch.setattr(CommandRunner, "on_message", watched)
    async with running_server(server_settings(tmp_path / "state")) as server:
        token = await server.add_cluster("prod-eu")
        script = Script()
        settings = agent_settings(server, "prod-eu", token, tmp_path / "creds")
        async with command_agent(settings, script, concurrency=1) as (agent, runner):
            await agent.wait_connected()
            first = await submit(server, command("gate-first"))
            await script.started.get()
            raced = await submit(server, command("ok-raced"))
            await offered.wait()
            status, cancelled = await server.api("POST", f"/api/v1/commands/{raced['id']}/cancel")
            assert (status, cancelled["state"]) == (200, "cancelled")
            release.set()
            # The server tells the agent: the attempt it just accepted is cancelled.
            await asyncio.wait_for(told.wait(), 30)
            assert cancels == [{"id": raced["id"], "attempt": 1}]
            job = runner.jobs.get((raced["id"], 1))
            assert job is None or job.state == "finished"  # reported, or being reported
            after = await submit(server, command("ok-after"))
            script.gate.set()
            await until_state(server, first["id"], "succeeded")
            await until_state(server, after["id"], "succeeded")
        assert (raced["id"], 1) not in script.runs
        assert [run[0] for run in script.runs] == [first["id"], after["id"]]
        final = await until_state(server, raced["id"], "cancelled")
        assert final["error"] == "cancelled before delivery"
