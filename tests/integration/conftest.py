from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from .harness import RunningServer, running_server, server_settings


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[RunningServer]:
    async with running_server(server_settings(tmp_path / "state")) as running:
        yield running
