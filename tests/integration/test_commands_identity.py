"""End to end: a command acts as its submitter, unless an admin's grant says --commands-as-agent.

The server decides the identity from the submitter's grant when it offers the
command; the agent impersonates it on every API call; the stand-in's policy
refuses ``tunnel:alice`` what a test denies her (everyone else may do anything).
"""

from __future__ import annotations

import json
from typing import Any

from .test_commands_delivery import until_state
from .test_commands_types import PASSWORD_REF, SECRET, Cluster, cluster

__all__ = ["cluster"]  # the fixture, shared with test_commands_types


async def _alice(cluster: Cluster, **grant: Any) -> str:
    server = cluster.server
    status, answer = await server.api(
        "POST", "/api/v1/users", {"name": "alice", "groups": ["dev"], "admin": False}
    )
    assert status == 201, answer
    status, granted = await server.api(
        "PUT", "/api/v1/grants/alice/prod-eu", {"as_groups": ["ops"], "commands": True, **grant}
    )
    assert status == 200, granted
    token: str = answer["token"]
    return token


async def _run(cluster: Cluster, token: str, spec: dict[str, Any]) -> dict[str, Any]:
    document = {"apiVersion": "tunnel/v1", "type": "manifests", "name": "app", "spec": spec}
    status, created = await cluster.server.api(
        "POST", "/api/v1/clusters/prod-eu/commands", {"spec": document}, token=token
    )
    assert status == 201, created
    return await until_state(cluster.server, created["id"], "succeeded", "failed", "timed_out")


def _settings() -> dict[str, Any]:
    return {
        "wait": False,
        "objects": [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "copied", "namespace": "apps"},
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
                "metadata": {"name": "everything"},
                "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}],
            }
        ],
    }


async def test_a_users_command_cannot_copy_a_secret_the_user_cannot_read(cluster: Cluster) -> None:
    cluster.stub.deny("tunnel:alice", "get", "secrets", namespace="vault")
    token = await _alice(cluster)
    finished = await _run(cluster, token, _settings())
    assert finished["state"] == "failed"
    assert (
        "tunnel:alice (groups tunnel:dev, tunnel:ops) may not get secret vault/db"
        in (finished["error"])
    )
    assert cluster.stub.get("v1", "ConfigMap", "copied", "apps") is None
    secret_reads = cluster.stub.requests.matching(
        lambda r: r.path == "/api/v1/namespaces/vault/secrets/db"
    )
    assert [r.header_values("Impersonate-User") for r in secret_reads] == [["tunnel:alice"]]
    assert secret_reads[0].header_values("Impersonate-Group") == ["tunnel:dev", "tunnel:ops"]


async def test_a_users_command_cannot_apply_what_the_user_cannot_create(cluster: Cluster) -> None:
    cluster.stub.deny("tunnel:alice", "create", "clusterroles")
    token = await _alice(cluster)
    finished = await _run(cluster, token, _cluster_role())
    assert finished["state"] == "failed"
    assert 'User "tunnel:alice" cannot create resource "clusterroles"' in finished["error"]
    assert cluster.stub.get("rbac.authorization.k8s.io/v1", "ClusterRole", "everything") is None


async def test_under_commands_as_agent_the_same_commands_succeed_and_the_grant_is_audited(
    cluster: Cluster,
) -> None:
    cluster.stub.deny("tunnel:alice", "get", "secrets", namespace="vault")
    cluster.stub.deny("tunnel:alice", "create", "clusterroles")
    token = await _alice(cluster, commands_as_agent=True)
    copied = await _run(cluster, token, _settings())
    assert copied["state"] == "succeeded", copied["error"]
    configmap = cluster.stub.get("v1", "ConfigMap", "copied", "apps")
    assert configmap is not None
    assert configmap["data"]["password"] == SECRET
    role = await _run(cluster, token, _cluster_role())
    assert role["state"] == "succeeded", role["error"]
    status, grants = await cluster.server.api("GET", "/api/v1/grants?user=alice")
    assert status == 200
    assert grants[0]["commands_as_agent"] is True
    await cluster.server.context.audit.flush()
    status, events = await cluster.server.api("GET", "/api/v1/audit?kind=admin")
    assert status == 200
    assert any(
        event["verb"] == "grant.commands-as-agent" and event["path"] == "alice@prod-eu"
        for event in events
    )


async def test_an_admins_command_acts_as_the_admin(cluster: Cluster) -> None:
    cluster.stub.deny("tunnel:admin", "create", "clusterroles")
    document = {
        "apiVersion": "tunnel/v1",
        "type": "manifests",
        "name": "role",
        "spec": _cluster_role(),
    }
    status, created = await cluster.server.api(
        "POST", "/api/v1/clusters/prod-eu/commands", {"spec": document}
    )
    assert status == 201, created
    finished = await until_state(cluster.server, created["id"], "succeeded", "failed")
    assert finished["state"] == "failed"
    assert 'User "tunnel:admin" cannot create resource "clusterroles"' in finished["error"]


async def test_commands_as_agent_needs_commands(cluster: Cluster) -> None:
    await _alice(cluster)
    status, answer = await cluster.server.api(
        "PUT", "/api/v1/grants/alice/prod-eu", {"commands_as_agent": True}
    )
    assert status == 400
    assert "commands_as_agent needs commands: true" in json.dumps(answer)
