"""A real server on PostgreSQL: its state goes to the database, and its password nowhere."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import pytest

from tests.integration.harness import running_server, server_settings
from tunnel_server.config import StoreSettings
from tunnel_server.errors import ConfigError
from tunnel_server.store import PostgresStore

PASSWORD = "s3cret-db-pw"


def with_password(url: str) -> str:
    """``url`` with a password (the test server trusts its clients: it goes unused)."""
    parts = urlsplit(url)
    netloc = f"{parts.username or 'postgres'}:{PASSWORD}@{parts.hostname}:{parts.port or 5432}"
    return parts._replace(netloc=netloc).geturl()


async def test_a_server_on_postgresql_keeps_its_state_in_the_database(
    postgres_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    url = with_password(postgres_url)
    settings = server_settings(tmp_path / "state", store=StoreSettings(database=url))
    async with running_server(settings) as server:
        assert isinstance(server.context.store, PostgresStore)
        await server.add_cluster("prod")
        status, clusters = await server.api("GET", "/api/v1/clusters")
        assert status == 200
        assert [cluster["name"] for cluster in clusters] == ["prod"]
        status, _ = await server.api("GET", "/readyz")
        assert status == 200

    assert not (tmp_path / "state" / "state.db").exists()
    raw = await asyncpg.connect(postgres_url)
    try:
        assert await raw.fetchval("SELECT name FROM clusters") == "prod"
        assert await raw.fetchval("SELECT count(*) FROM bootstrap_tokens") == 1
        assert await raw.fetchval("SELECT is_admin FROM users WHERE name = 'admin'") is True
    finally:
        await raw.close()
    assert "postgresql://postgres:***@" in caplog.text
    assert PASSWORD not in caplog.text
    assert PASSWORD not in repr(settings)


def test_only_a_postgresql_url_names_a_database() -> None:
    with pytest.raises(ConfigError, match="postgresql://"):
        StoreSettings(database="mysql://db/state")
    assert StoreSettings().database is None


def test_a_server_on_sqlite_never_loads_asyncpg() -> None:
    """Everything of the server imports the store package; only --database loads the driver."""
    probe = (
        "import sys\n"
        "import tunnel_server.app, tunnel_server.cli, tunnel_server.edge.frontdoor\n"
        "from tunnel_server.store import SqliteStore\n"
        "print('asyncpg' in sys.modules)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert run.stdout.strip() == "False"
