"""A stand-in per test, and kubectl (the real binary) pointed at it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.kubestub import KubeStub

from .kubectl import Kubectl


@pytest.fixture
async def stub() -> AsyncIterator[KubeStub]:
    async with KubeStub() as running:
        running.add_pod("demo")
        yield running


@pytest.fixture
def kubectl(stub: KubeStub, tmp_path: Path) -> Kubectl:
    home = tmp_path / "home"
    home.mkdir()
    return Kubectl(stub.write_kubeconfig(tmp_path / "kubeconfig"), home, tmp_path)
