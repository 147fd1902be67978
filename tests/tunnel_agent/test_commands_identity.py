"""A command acts as its submitter: the cluster's RBAC judges each of its API calls as theirs.

The stand-in enforces its policy on the impersonated identity; ``tunnel:alice``
is refused what a test denies her, everyone else may do anything.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakebin.support import Harness, command, harness
from tunnel_agent.executors import execute
from tunnel_agent.identity import AGENT, RunIdentity

ALICE = RunIdentity("tunnel:alice", ("tunnel:dev", "tunnel:ops"))
SECRET = "s3cr3t-Pa55w0rd"
PASSWORD_REF = {"secretRef": {"namespace": "vault", "name": "db", "key": "password"}}


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    async with harness(tmp_path) as running:
        for namespace in ("vault", "web"):
            running.stub.add(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
            )
        running.add_secret("vault", "db", {"password": SECRET})
        yield running


def _settings() -> dict[str, Any]:
    return {
        "namespace": "web",
        "wait": False,
        "objects": [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "settings"},
                "data": {"password": PASSWORD_REF},
            }
        ],
    }


def _cluster_role() -> dict[str, Any]:
    return {
        "wait": False,
        "objects": [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": "reader"},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}],
            }
        ],
    }


async def test_a_secret_ref_the_submitter_may_not_read_is_refused_and_nothing_is_written(
    h: Harness,
) -> None:
    h.stub.deny("tunnel:alice", "get", "secrets", namespace="vault")
    result = await execute(command("manifests", _settings()), h.context(identity=ALICE))
    assert result.outcome == "failed"
    assert result.error is not None
    assert "tunnel:alice" in result.error
    assert "may not get secret vault/db (HTTP 403)" in result.error
    assert SECRET not in h.log_text()
    assert h.stub.get("v1", "ConfigMap", "settings", "web") is None
    # Nothing of the submitter's was written: only the agent's own apply-set record.
    writes = [r for r in h.stub.requests if r.method in ("PATCH", "POST", "PUT", "DELETE")]
    assert all("tunnel-applyset-" in r.path for r in writes)


async def test_the_same_secret_ref_works_when_the_command_acts_as_the_agent(h: Harness) -> None:
    h.stub.deny("tunnel:alice", "get", "secrets", namespace="vault")
    result = await execute(command("manifests", _settings()), h.context(identity=AGENT))
    assert result.outcome == "succeeded", result.error
    configmap = h.stub.get("v1", "ConfigMap", "settings", "web")
    assert configmap is not None
    assert configmap["data"]["password"] == SECRET


async def test_an_apply_the_submitter_may_not_make_is_refused_with_the_api_servers_reason(
    h: Harness,
) -> None:
    h.stub.deny("tunnel:alice", "create", "clusterroles")
    result = await execute(command("manifests", _cluster_role()), h.context(identity=ALICE))
    assert result.outcome == "failed"
    assert result.error is not None
    assert 'User "tunnel:alice" cannot create resource "clusterroles"' in result.error
    # The identity with its groups, as the cluster was told it.
    assert "the command acts as tunnel:alice (groups tunnel:dev, tunnel:ops)" in result.error
    assert h.stub.get("rbac.authorization.k8s.io/v1", "ClusterRole", "reader") is None


async def test_the_same_apply_succeeds_as_the_agent(h: Harness) -> None:
    h.stub.deny("tunnel:alice", "create", "clusterroles")
    result = await execute(command("manifests", _cluster_role()), h.context(identity=AGENT))
    assert result.outcome == "succeeded", result.error
    assert h.stub.get("rbac.authorization.k8s.io/v1", "ClusterRole", "reader") is not None


async def test_a_role_of_a_group_the_grant_adds_is_the_submitters_too(h: Harness) -> None:
    h.stub.deny("group:tunnel:ops", "create", "clusterroles")
    result = await execute(command("manifests", _cluster_role()), h.context(identity=ALICE))
    assert result.outcome == "failed"
    assert "cannot create resource" in (result.error or "")


async def test_every_call_but_the_apply_set_record_carries_the_submitters_identity(
    h: Harness,
) -> None:
    spec = _settings() | {"prune": True}
    result = await execute(command("manifests", spec), h.context(identity=ALICE))
    assert result.outcome == "succeeded", result.error
    requests = list(h.stub.requests)
    records = [r for r in requests if "tunnel-applyset-" in r.path]
    theirs = [r for r in requests if "tunnel-applyset-" not in r.path]
    assert records
    assert theirs
    for request in theirs:
        assert request.header_values("Impersonate-User") == ["tunnel:alice"], request.path
        assert request.header_values("Impersonate-Group") == ["tunnel:dev", "tunnel:ops"]
        assert request.user is not None
        assert request.user.name == "tunnel:alice"
    # The record is the agent's own bookkeeping in its namespace.
    for request in records:
        assert request.header("Impersonate-User") is None


async def test_the_outputs_secret_is_written_as_the_submitter(
    h: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.fakebin import fake_environment
    from tests.tunnel_agent.file_sources import allowing_file_sources
    from tests.tunnel_agent.test_executors_tofu import make_repository

    allowing_file_sources(h, monkeypatch)
    url = make_repository(tmp_path / "repository")
    h.stub.deny("tunnel:alice", "patch", "secrets", namespace="web")
    spec = {"git": {"url": url, "ref": "main", "path": "infra"}, "backend": {"local": True}}
    result = await execute(
        command("tofu", spec, outputsSecret={"namespace": "web", "name": "out"}),
        h.context(fake_environment(tmp_path / "record.jsonl"), identity=ALICE),
    )
    assert result.outcome == "failed"
    assert "cannot write the outputs to outputsSecret web/out" in (result.error or "")
    assert 'User "tunnel:alice" cannot patch resource "secrets"' in (result.error or "")
    assert h.secret_data("web", "out") is None


async def test_a_query_reads_as_the_submitter(h: Harness) -> None:
    h.stub.deny("tunnel:alice", "list", "pods", namespace="web")
    spec = {"get": {"apiVersion": "v1", "kind": "Pod", "namespace": "web"}}
    result = await execute(command("query", spec), h.context(identity=ALICE))
    assert result.outcome == "failed"
    assert 'User "tunnel:alice" cannot list resource "pods"' in (result.error or "")
