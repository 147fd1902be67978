"""Stopping the agent while a connection attempt fails: the stop is not lost."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tunnel_agent.config import AgentSettings, ConnectSettings
from tunnel_agent.connector import Agent
from tunnel_agent.credentials import DirectoryCredentialStore
from tunnel_agent.errors import ConnectError


async def test_a_stop_that_meets_a_failing_connect_stops_the_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = AgentSettings(
        server_url="https://127.0.0.1:1",
        ca_pem=b"",
        cluster="prod-eu",
        credentials_dir=tmp_path,
        connect=ConnectSettings(backoff_base=30.0, backoff_cap=30.0),
    )
    agent = Agent(settings, DirectoryCredentialStore(tmp_path))
    connecting = asyncio.Event()

    async def credentials() -> Any:
        return object()

    async def refused(_credentials: Any) -> None:
        # What asyncio.wait_for does on Python 3.11 when a cancellation meets
        # a connect that has just failed: it raises the failure, not the cancellation.
        connecting.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise ConnectError("cannot reach the server: connection refused") from None

    monkeypatch.setattr(agent, "_ready_credentials", credentials)
    monkeypatch.setattr(agent, "_serve_one_connection", refused)
    task = asyncio.create_task(agent.run())
    await connecting.wait()
    task.cancel()
    # Not 30 s of backoff and another attempt: the stop is honoured at once.
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert task.cancelled()
