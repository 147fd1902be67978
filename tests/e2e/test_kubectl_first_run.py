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


async def an_offline_cluster(tunnel: Tunnel, name: str) -> Path:
    """A kubeconfig of alice's for cluster ``name``, which has no agent connected."""
    await tunnel.server.add_cluster(name)
    status, _ = await tunnel.server.api("PUT", f"/api/v1/grants/alice/{name}", {})
    assert status == 200
    status, answer = await tunnel.server.api(
        "POST", f"/api/v1/users/alice/kubeconfig?cluster={name}"
    )
    assert status == 201
    kubeconfig = tunnel.settings_dir / f"{name}.yaml"
    kubeconfig.write_text(answer["kubeconfig"].replace("https://127.0.0.1:1", tunnel.server.url))
    return kubeconfig


async def test_an_offline_cluster_is_said_plainly_on_the_first_run(
    tunnel: Tunnel, fresh_home: Path
) -> None:
    kubeconfig = await an_offline_cluster(tunnel, "dark")

    result = await Kubectl(kubeconfig, fresh_home, fresh_home).run("get", "pods")

    assert result.returncode != 0
    # client-go prints its own words for a 503 on discovery; the Warning says why.
    assert "Warning: cluster dark is not connected (its agent is offline)" in result.stderr
    assert result.stderr.count("Warning:") == 1  # kubectl prints each text once


async def test_a_refusal_kubectl_prints_itself_carries_no_warning(
    tunnel: Tunnel, fresh_home: Path
) -> None:
    kubeconfig = await an_offline_cluster(tunnel, "dark")

    result = await Kubectl(kubeconfig, fresh_home, fresh_home).run(
        "get",
        "--raw",
        "/k8s/clusters/dark/api/v1/namespaces/default/pods",  # not under the server URL
    )

    assert result.returncode != 0
    assert (
        "Error from server (ServiceUnavailable): cluster dark is not connected "
        "(its agent is offline)" in result.stderr
    )
    assert "Warning:" not in result.stderr


async def test_a_token_not_valid_is_said_plainly_on_the_first_run(
    tunnel: Tunnel, fresh_home: Path
) -> None:
    kubeconfig = tunnel.settings_dir / "stale-token.yaml"
    kubeconfig.write_text(
        tunnel.kubectl.kubeconfig.read_text().replace(tunnel.alice_token, "tat_" + "0" * 43)
    )

    result = await Kubectl(kubeconfig, fresh_home, fresh_home).run("get", "pods")

    assert result.returncode != 0
    assert "error: You must be logged in to the server" in result.stderr
    # client-go's own words in the error; the tunnel's in the Warning before it.
    assert "Warning: the API token is not valid (unknown, expired or revoked)" in result.stderr
