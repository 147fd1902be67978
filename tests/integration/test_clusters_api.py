"""Registering clusters: RBAC variants and their install manifests."""

from __future__ import annotations

import yaml

from .harness import RunningServer


async def test_namespaced_cluster_gets_roles_in_its_namespaces_only(server: RunningServer) -> None:
    status, answer = await server.api(
        "POST",
        "/api/v1/clusters",
        {"name": "team", "rbac": "namespaced", "namespaces": ["team-a", "team-b"]},
    )
    assert status == 201, answer
    assert answer["cluster"]["namespaces"] == ["team-a", "team-b"]
    objects = [doc for doc in yaml.safe_load_all(answer["manifest"]) if doc]
    role_namespaces = {
        obj["metadata"]["namespace"] for obj in objects if obj["kind"] in ("Role", "RoleBinding")
    }
    assert {"team-a", "team-b"} <= role_namespaces
    assert not any(
        obj["kind"] == "ClusterRoleBinding" and "commands" in obj["metadata"]["name"]
        for obj in objects
    )


async def test_a_refused_registration_leaves_no_cluster_behind(server: RunningServer) -> None:
    for body, problem in (
        ({"name": "x", "rbac": "namespaced"}, "needs its namespaces"),
        ({"name": "x", "rbac": "full", "namespaces": ["a"]}, "namespaced only"),
        ({"name": "x", "rbac": "namespaced", "namespaces": ["Not_A_Name"]}, "not a valid"),
        ({"name": "x", "rbac": "namespaced", "namespaces": ["team-a\n"]}, "not a valid"),
        (
            {"name": "x", "rbac": "namespaced", "namespaces": ["web", "tunnel-agent"]},
            "namespace tunnel-agent is the agent's own: a namespaced agent may not serve it",
        ),
        (
            {"name": "x", "rbac": "namespaced", "namespaces": ["kube-system"]},
            "kube-system holds the cluster's controllers",
        ),
    ):
        status, answer = await server.api("POST", "/api/v1/clusters", body)
        assert status == 400, answer
        assert problem in answer["error"]["message"]
    status, clusters = await server.api("GET", "/api/v1/clusters")
    assert clusters == []


async def test_read_only_cluster_manifest_cannot_read_secrets(server: RunningServer) -> None:
    status, answer = await server.api(
        "POST", "/api/v1/clusters", {"name": "viewer", "rbac": "read-only"}
    )
    assert status == 201
    rules = [
        rule
        for obj in yaml.safe_load_all(answer["manifest"])
        if obj and obj["kind"] == "ClusterRole"
        for rule in obj.get("rules", [])
    ]
    secret_reads = [
        rule
        for rule in rules
        if "secrets" in rule.get("resources", []) and {"get", "list"} & set(rule.get("verbs", []))
    ]
    assert secret_reads == []


async def test_a_clusters_registration_tokens_revocation_and_deletion_are_audited(
    server: RunningServer,
) -> None:
    # A bootstrap token is enough to take over the cluster's agent: who asked is on record.
    await server.add_cluster("edge")
    for method, path in (
        ("POST", "/api/v1/clusters/edge/token"),
        ("POST", "/api/v1/clusters/edge/revoke"),
        ("DELETE", "/api/v1/clusters/edge"),
    ):
        status, answer = await server.api(method, path)
        assert status in (200, 201), (path, answer)
    await server.context.audit.flush()
    status, events = await server.api("GET", "/api/v1/audit?kind=admin&cluster=edge")
    assert status == 200
    assert sorted(event["verb"] for event in events) == [
        "cluster.add",
        "cluster.delete",
        "cluster.revoke",
        "cluster.token",
    ]
    assert {event["user"] for event in events} == {"admin"}
