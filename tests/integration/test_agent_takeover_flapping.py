"""Two agents with one certificate, on two addresses: the server stops them flapping.

Found in review: two agents presenting one client certificate (a copied
credentials Secret, a stolen key) replaced each other about once a second,
each takeover cutting the requests in flight, with nothing above INFO in the
log. Now the third takeover within a minute between addresses that come back
is refused (409, Retry-After), warned about, audited and counted; the
connection serving keeps serving. One move to a new address is no flap.

Real agents on loopback: 127.0.0.1 and 127.0.0.2 stand for two nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import shutil
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from tunnel_agent.backoff import Backoff
from tunnel_agent.config import AgentSettings
from tunnel_agent.connector import Agent
from tunnel_agent.credentials import DirectoryCredentialStore
from tunnel_server.agents import endpoint
from tunnel_server.agents.endpoint import TAKEOVER_REFUSED

from ..support import until
from .harness import RunningAgent, RunningServer, agent_settings
from .test_observability import server_metrics

#: Bound on the agents' flapping (a few reconnects, each after at most 0.5 s of back-off).
FLAPS = 60.0

NODE_A, NODE_B = "127.0.0.1", "127.0.0.2"


class AgentAt(Agent):
    """An agent that dials from a given loopback address, as from another node."""

    def __init__(self, *args: Any, source: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.source = source

    def _http(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(local_addr=(self.source, 0)),
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=self.settings.connect.connect_timeout
            ),
        )


@asynccontextmanager
async def agent_at(
    source: str, settings: AgentSettings, backoff: Backoff | None = None
) -> AsyncIterator[RunningAgent]:
    assert settings.credentials_dir is not None
    agent = AgentAt(
        settings, DirectoryCredentialStore(settings.credentials_dir), source=source, backoff=backoff
    )
    running = RunningAgent(agent, asyncio.create_task(agent.run()))
    try:
        yield running
    finally:
        await running.stop()


class Records(logging.Handler):
    """What the agent socket logs, as it comes: to wait on, not to poll."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seen: list[logging.LogRecord] = []
        self._queue: asyncio.Queue[logging.LogRecord] = asyncio.Queue()

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(record)
        self._queue.put_nowait(record)

    async def first(self, wanted: Callable[[logging.LogRecord], bool]) -> logging.LogRecord:
        async with asyncio.timeout(FLAPS):
            while not wanted(record := await self._queue.get()):
                pass
        return record


@contextlib.contextmanager
def watching() -> Iterator[Records]:
    logger = logging.getLogger(endpoint.__name__)
    records, level = Records(), logger.level
    logger.addHandler(records)
    logger.setLevel(logging.INFO)
    try:
        yield records
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)


def flap_warning(record: logging.LogRecord) -> bool:
    return record.levelno == logging.WARNING and "share" in record.getMessage()


def backoff_refusal(record: logging.LogRecord) -> bool:
    return record.levelno == logging.INFO and "back-off" in record.getMessage()


class Patient(random.Random):
    """Back-off draws at their bound: an agent that was replaced stays away (its pod is gone)."""

    def uniform(self, a: float, b: float) -> float:
        return b


async def test_two_agents_sharing_a_certificate_are_refused_once_they_flap(
    server: RunningServer, tmp_path: Path
) -> None:
    token = await server.add_cluster("prod")
    registry = server.context.registry
    with watching() as log:
        node_a = agent_settings(server, "prod", token, tmp_path / "node-a")
        async with agent_at(NODE_A, node_a) as first:
            await first.wait_connected()
            await until(lambda: registry.get("prod") is not None)
            # The credentials Secret, copied to a second cluster: same key, same certificate.
            shutil.copytree(tmp_path / "node-a", tmp_path / "node-b")
            node_b = agent_settings(server, "prod", None, tmp_path / "node-b")
            async with agent_at(NODE_B, node_b) as second:
                # B takes over, A comes back, B's return is the third takeover: refused.
                warning = await log.first(flap_warning)
                serving = registry.get("prod")
                assert serving is not None
                assert serving.remote_addr == NODE_A
                connections = first.agent.connections
                assert connections == 2
                # B keeps trying, with its back-off, and keeps being refused; A keeps serving.
                await log.first(backoff_refusal)
                await log.first(backoff_refusal)
                assert registry.get("prod") is serving
                assert serving.session.is_open
                assert not serving.session.connection.going_away
                assert first.agent.connected.is_set()
                assert first.agent.connections == connections
                assert not second.agent.connected.is_set()
                assert second.agent.last_error is not None
                assert "refused this connection for now" in second.agent.last_error
                assert "seem to share one certificate" in second.agent.last_error
                assert not second.task.done()  # it backs off, it does not stop

    message = warning.getMessage()
    assert getattr(warning, "cluster", None) == "prod"
    assert getattr(warning, "remote", None) == NODE_B
    assert f"{NODE_A}, {NODE_B}" in message
    assert "3 times within 60s" in message
    # Addresses and counts only: no certificate, key or token.
    credentials = tmp_path / "node-a"
    for secret in ((credentials / "tls.crt").read_text(), (credentials / "tls.key").read_text()):
        assert secret.splitlines()[1] not in message
    assert "BEGIN" not in message
    assert token not in message

    await server.context.audit.flush()
    events = await server.context.store.list_audit(cluster="prod", kind="admin")
    [event] = [event for event in events if event.verb == TAKEOVER_REFUSED]
    assert event.user is None
    assert event.status == 409
    assert event.detail == {
        "cluster": "prod",
        "refused": NODE_B,
        "serving": NODE_A,
        "sources": [NODE_A, NODE_B],
        "takeovers": 3,
        "window_seconds": 60.0,
        "refused_for_seconds": 600.0,
        "same_certificate": True,
    }

    found = await server_metrics(server)
    refused = "tunnel_server_agent_takeovers_refused_total"
    assert found[(refused, (("reason", "flapping"),))] == 1
    assert found[(refused, (("reason", "backoff"),))] >= 2
    by_code = ("tunnel_server_agent_refusals_total", (("reason", "agent_takeover_refused"),))
    assert found[by_code] >= 3


async def test_an_agent_that_moves_to_another_address_once_is_no_flap(
    server: RunningServer, tmp_path: Path
) -> None:
    """A pod rescheduled to another node: its old connection is still open when it dials."""
    token = await server.add_cluster("prod")
    registry = server.context.registry
    with watching() as log:
        old_node = agent_settings(server, "prod", token, tmp_path / "node-a")
        async with agent_at(NODE_A, old_node, backoff=Backoff(base=3600.0, rng=Patient())) as old:
            await old.wait_connected()
            await until(lambda: registry.get("prod") is not None)
            shutil.copytree(tmp_path / "node-a", tmp_path / "node-b")
            new_node = agent_settings(server, "prod", None, tmp_path / "node-b")
            async with agent_at(NODE_B, new_node) as new:
                await new.wait_connected()
                await until(lambda: not old.agent.connected.is_set())
                serving = registry.get("prod")
                assert serving is not None
                assert serving.remote_addr == NODE_B
                assert new.agent.connections == 1
                assert new.agent.failed_attempts == 0
    assert not [record for record in log.seen if record.levelno >= logging.WARNING]
    found = await server_metrics(server)
    refused = "tunnel_server_agent_takeovers_refused_total"
    assert found[(refused, (("reason", "flapping"),))] == 0
    assert found[(refused, (("reason", "backoff"),))] == 0
