"""The TLS listener's tests also run on uvloop, the loop the server picks; the store's
behaviour tests run on each of the store's engines.

The listener's tests drive sockets below asyncio's streams (readers on raw
descriptors, a handshake cancelled half-way), where the two loops differ. The
rest of this directory runs on asyncio's loop alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path

import pytest

from tests.both_loops import pytest_asyncio_loop_factories as both_loops
from tests.tunnel_server.store_engines import ENGINES, OpenStore, fresh_database
from tunnel_server.store import PostgresStore, SqliteStore, Store

ON_BOTH_LOOPS = {"test_listener.py"}


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    if item.path.name in ON_BOTH_LOOPS:
        return both_loops(config, item)
    return {"asyncio": asyncio.new_event_loop}


def pytest_itemcollected(item: pytest.Item) -> None:
    if item.path.name in ON_BOTH_LOOPS:
        item.add_marker(pytest.mark.timeout(120, method="thread"))


# --- The store's engines --------------------------------------------------------
#
# The store's behaviour tests (test_store_*.py) take `store`, or `open_store` to
# open more than one store on the same database; both run once on each engine.


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    """The store's engine the test runs on."""
    return str(request.param)


@pytest.fixture
async def postgres_url() -> AsyncIterator[str]:
    """The URL of a new PostgreSQL database of this test's own, dropped afterwards."""
    async with fresh_database() as url:
        yield url


@pytest.fixture
def open_store(engine: str, request: pytest.FixtureRequest, tmp_path: Path) -> OpenStore:
    """Opens a store of ``engine`` on this test's database (the same one each time)."""
    if engine == "sqlite":
        path = tmp_path / "state.db"

        async def open_sqlite() -> Store:
            return await SqliteStore.open(path)

        return open_sqlite
    url: str = request.getfixturevalue("postgres_url")

    async def open_postgres() -> Store:
        return await PostgresStore.open(url, max_connections=4)

    return open_postgres


@pytest.fixture
async def store(open_store: OpenStore) -> AsyncIterator[Store]:
    """A store of each engine, closed after the test."""
    opened = await open_store()
    yield opened
    await opened.close()


__all__ = [
    "engine",
    "open_store",
    "postgres_url",
    "pytest_asyncio_loop_factories",
    "pytest_itemcollected",
    "store",
]
