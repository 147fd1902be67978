"""An agent that runs commands with a scripted executor, to test delivery itself.

The executor's behaviour is chosen by the command's name: ``ok-*`` logs three
lines and succeeds, ``fail-*`` fails, ``hang-*`` runs until cancelled, and
``gate-*`` waits until the test opens ``Script.gate``. Real executors are
tested on their own (tests/tunnel_agent/test_executors_*).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from protocol import kinds
from tunnel_agent.config import AgentSettings
from tunnel_agent.credentials import DirectoryCredentialStore
from tunnel_agent.journal import Journal
from tunnel_agent.router import StreamRouter
from tunnel_agent.runner import CommandRunner, JobContext, RunnerSettings
from tunnel_commands import CommandSpecError, parse_command
from tunnel_pki.tls import client_context

from .harness import RunningAgent, RunningServer, running_agent


def command(name: str, *, attempts: int = 1, timeout: str = "10m") -> dict[str, Any]:
    """A valid spec (a query) whose name picks the scripted behaviour."""
    return {
        "apiVersion": "tunnel/v1",
        "type": "query",
        "name": name,
        "timeout": timeout,
        "retry": {"maxAttempts": attempts},
        "spec": {"get": {"apiVersion": "v1", "kind": "Namespace", "name": "default"}},
    }


@dataclass
class Script:
    """What the scripted executor did, and a gate tests can open."""

    runs: list[tuple[str, int]] = field(default_factory=list)
    started: asyncio.Queue[tuple[str, int]] = field(default_factory=asyncio.Queue)
    cancelled: list[str] = field(default_factory=list)
    gate: asyncio.Event = field(default_factory=asyncio.Event)

    async def execute(self, spec: dict[str, Any], context: JobContext) -> dict[str, Any]:
        name = spec["name"]
        self.runs.append((context.command_id, context.attempt))
        await self.started.put((context.command_id, context.attempt))
        try:
            if name.startswith("hang-"):
                await asyncio.Event().wait()
            if name.startswith("gate-"):
                await self.gate.wait()
            for number in range(3):
                context.log(f"{name}: step {number}")
            if name.startswith("fail-"):
                return {"outcome": "failed", "summary": {}, "error": "scripted failure"}
            return {"outcome": "succeeded", "summary": {"steps": 3}, "outputs": ["answer"]}
        except asyncio.CancelledError:
            self.cancelled.append(context.command_id)
            raise


def validate(spec: dict[str, Any]) -> None:
    try:
        parse_command(spec)
    except CommandSpecError as exc:
        raise ValueError(str(exc)) from exc


@asynccontextmanager
async def command_agent(
    settings: AgentSettings, script: Script, *, concurrency: int = 2
) -> AsyncIterator[tuple[RunningAgent, CommandRunner]]:
    """An agent serving commands through ``script``; its journal in the creds dir."""
    assert settings.credentials_dir is not None
    runner = CommandRunner(
        script.execute,
        validate,
        Journal(DirectoryCredentialStore(settings.credentials_dir)),
        RunnerSettings(concurrency=concurrency, heartbeat=0.5),
    )
    router = StreamRouter()
    router.add(kinds.STREAM_COMMAND, runner.handle_offer)
    runner_task = asyncio.create_task(runner.run())
    try:
        async with running_agent(
            settings,
            on_stream=router,
            on_message=runner.on_message,
            on_connected=runner.connected,
            on_disconnected=runner.disconnected,
        ) as agent:
            yield agent, runner
    finally:
        runner_task.cancel()
        await asyncio.gather(runner_task, return_exceptions=True)


def credentials_dir(tmp_path: Path, name: str = "creds") -> Path:
    return tmp_path / name


async def log_records(
    server: RunningServer, command_id: str, query: str = "follow=1"
) -> AsyncIterator[Any]:
    """The records of a command's log request (as the admin), as they come."""
    assert server._http is not None
    async with server._http.get(
        f"{server.url}/api/v1/commands/{command_id}/logs?{query}",
        headers={"Authorization": f"Bearer {server.admin_token}"},
        ssl=client_context(server.ca_pem),
    ) as response:
        assert response.status == 200
        async for line in response.content:
            yield json.loads(line)


async def records_of(server: RunningServer, command_id: str, query: str = "follow=1") -> list[Any]:
    """Every record of a command's log request, once it ends."""
    return [record async for record in log_records(server, command_id, query)]
