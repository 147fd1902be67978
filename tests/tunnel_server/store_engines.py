"""The store's engines for its behaviour tests, and a fresh PostgreSQL database for each.

The tests find the server through ``TUNNEL_TEST_POSTGRES`` (a URL to a
database from which others can be created; by default
``postgresql://postgres@127.0.0.1:5432/postgres``). ``scripts/test`` starts a
private server for the run when nothing answers there. Without a server the
PostgreSQL tests fail, saying so: a skipped test proves nothing.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

import asyncpg
import pytest

from tunnel_server.store import Store
from tunnel_server.store.postgres import redact_url

__all__ = [
    "DEFAULT_URL",
    "ENGINES",
    "URL_VARIABLE",
    "OpenStore",
    "admin_url",
    "database_url",
    "fresh_database",
]

ENGINES = ("sqlite", "postgres")

OpenStore = Callable[[], Awaitable[Store]]
"""Opens another store on the test's database (``open_store`` in conftest.py)."""

URL_VARIABLE = "TUNNEL_TEST_POSTGRES"
DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def admin_url() -> str:
    """The URL of the server's database the tests create theirs from."""
    return os.environ.get(URL_VARIABLE) or DEFAULT_URL


def database_url(url: str, name: str) -> str:
    """``url`` pointed at the database ``name`` instead."""
    return urlsplit(url)._replace(path=f"/{name}").geturl()


async def connect_admin(url: str) -> asyncpg.Connection:
    """A connection to ``url``; the test fails, saying why, when no server answers."""
    try:
        return await asyncpg.connect(url, timeout=10)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        reason = repr(exc)
    pytest.fail(
        f"no PostgreSQL server for the store's tests at {redact_url(url)} ({reason});"
        f" start one, or point {URL_VARIABLE} at one (scripts/test starts a private"
        " server when none answers)",
        pytrace=False,
    )


@asynccontextmanager
async def fresh_database(server: str | None = None) -> AsyncIterator[str]:
    """The URL of a new, empty database (on ``server``, a URL like :func:`admin_url`'s,
    by default that one), dropped afterwards."""
    url = server or admin_url()
    name = f"tunnel_test_{os.getpid()}_{uuid.uuid4().hex[:12]}"
    admin = await connect_admin(url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield database_url(url, name)
        finally:
            if admin.is_closed():  # the server was restarted meanwhile
                admin = await connect_admin(url)
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()
