"""Fixtures of the console's tests: the store on each engine (as tests/tunnel_server's
store tests have it), and a real server (TLS on loopback) with an aiohttp client that keeps
cookies as a browser does. The cookie is ``Secure``: only a real TLS server gets it back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.console.support import ConsoleClient
from tests.integration.harness import RunningServer, running_server, server_settings
from tests.tunnel_server.store_engines import ENGINES, fresh_database
from tunnel_server.store import PostgresStore, SqliteStore, Store


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    """The store's engine the test runs on."""
    return str(request.param)


@pytest.fixture
async def store(engine: str, tmp_path: Path) -> AsyncIterator[Store]:
    """A store of each engine, closed after the test."""
    if engine == "sqlite":
        opened: Store = await SqliteStore.open(tmp_path / "state.db")
        yield opened
        await opened.close()
        return
    async with fresh_database() as url:
        opened = await PostgresStore.open(url, max_connections=4)
        yield opened
        await opened.close()


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[RunningServer]:
    """A real server (TLS on loopback) with the console, its store SQLite."""
    async with running_server(server_settings(tmp_path / "state")) as running:
        yield running


@pytest.fixture
async def client(server: RunningServer) -> AsyncIterator[ConsoleClient]:
    """A client of the console, signed in as nobody yet."""
    console = ConsoleClient(server)
    yield console
    await console.close()
