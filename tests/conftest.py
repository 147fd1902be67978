"""Refuse to test compiled modules built from older sources (scripts/compiled.py); fixtures
every part of the suite may use."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from protocol import connection
from scripts.compiled import stale_reason


def pytest_configure(config: pytest.Config) -> None:
    reason = stale_reason()
    if reason is not None:
        pytest.exit(reason, returncode=4)


def pytest_report_header(config: pytest.Config) -> str:
    compiled = not (connection.__file__ or "").endswith(".py")
    return f"request path: {'compiled with mypyc' if compiled else 'interpreted'}"


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A plain HTTP client session, closed after the test."""
    async with aiohttp.ClientSession() as session:
        yield session
