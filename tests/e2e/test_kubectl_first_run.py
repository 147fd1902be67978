"""Refusals read clearly on kubectl's first run, when its discovery cache is empty.

A new machine, a CI job, an expired cache: kubectl's first request is then
aggregated discovery, and client-go cannot read a Status from that answer;
it printed ``Error from server (Forbidden): unknown`` for every refusal.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e import test_kubectl_tunnel as kubectl_e2e
from tests.e2e.test_kubectl_tunnel import Tunnel
from tests.kubestub_tests.kubectl import Kubectl, Result

server = kubectl_e2e.server
tunnel = kubectl_e2e.tunnel


@pytest.fixture
def fresh_home(tmp_path: Path) -> Path:
    """A HOME of its own for kubectl: nothing cached."""
    home = tmp_path / "first-run-home"
    home.mkdir()
    return home


async def first_run(tunnel: Tunnel, home: Path, *args: str) -> Result:
    return await Kubectl(tunnel.kubectl.kubeconfig, home, home).run(*args)


async def test_no_grant_is_said_plainly_on_the_first_run(tunnel: Tunnel, fresh_home: Path) -> None:
    status, _ = await tunnel.server.api("DELETE", "/api/v1/grants/alice/prod-eu")
    assert status == 200
    result = await first_run(tunnel, fresh_home, "get", "pods")
    assert result.returncode != 0
    assert "Error from server (Forbidden): user alice has no grant on cluster prod-eu" in (
        result.stderr
    )
    assert "unknown" not in result.stderr


async def test_a_refused_impersonation_is_said_plainly_on_the_first_run(
    tunnel: Tunnel, fresh_home: Path
) -> None:
    result = await first_run(tunnel, fresh_home, "get", "pods", "--as", "tunnel:bob")
    assert result.returncode != 0
    assert "Error from server (Forbidden): user alice may not impersonate on this cluster" in (
        result.stderr
    )
    assert "unknown" not in result.stderr


async def test_the_first_run_with_access_works_as_before(tunnel: Tunnel, fresh_home: Path) -> None:
    result = await first_run(tunnel, fresh_home, "get", "pods")
    assert result.returncode == 0, result.stderr
    assert "demo" in result.stdout
