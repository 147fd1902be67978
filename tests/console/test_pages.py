"""Every console page renders for an admin, and the admin's actions ask first, then act
and land in the audit trail as their tunnelctl twins do (real TLS server)."""

from __future__ import annotations

import asyncio
import csv
import io
import json
from pathlib import Path

from protocol import kinds
from tests.console.support import ConsoleClient, add_user, csrf_of
from tests.integration.harness import RunningServer, agent_settings
from tests.support import until
from tunnel_agent.connector import Agent
from tunnel_agent.credentials import DirectoryCredentialStore

SPEC = {
    "apiVersion": "tunnel/v1",
    "type": "query",
    "name": "look",
    "spec": {"get": {"apiVersion": "v1", "kind": "Namespace", "name": "default"}},
}


async def signed_in_admin(server: RunningServer, client: ConsoleClient) -> str:
    await client.sign_in(server.admin_token)
    return await client.csrf()


async def test_cluster_command_and_audit_pages_render(
    server: RunningServer, client: ConsoleClient
) -> None:
    await server.add_cluster("prod")
    status, command = await server.api("POST", "/api/v1/clusters/prod/commands", SPEC)
    assert status == 201, command
    await signed_in_admin(server, client)
    cluster = await client.get("/ui/clusters/prod")
    assert cluster.status == 200
    assert "Cluster prod" in cluster.text
    assert "0 running, 1 pending" in cluster.text
    listing = await client.get("/ui/commands?cluster=prod&state=pending&type=query")
    assert command["id"] in listing.text
    assert command["id"] not in (await client.get("/ui/commands?type=helm")).text
    page = await client.get(f"/ui/commands/{command['id']}")
    assert page.status == 200
    assert "kind: Namespace" in page.text
    assert 'id="cancel"' in page.text
    audit = await client.get("/ui/audit?kind=admin&verb=cluster.add")
    assert audit.status == 200
    assert "cluster.add" in audit.text


async def test_the_audit_search_exports_json_lines_and_csv(
    server: RunningServer, client: ConsoleClient
) -> None:
    await server.add_cluster("prod")
    await signed_in_admin(server, client)
    lines = await client.get("/ui/audit/export?format=jsonl&verb=cluster.add")
    assert lines.status == 200
    assert lines.headers["Content-Disposition"] == 'attachment; filename="audit.jsonl"'
    records = [json.loads(line) for line in lines.text.splitlines()]
    assert [(r["verb"], r["cluster"]) for r in records] == [("cluster.add", "prod")]
    table = await client.get("/ui/audit/export?format=csv&cluster=prod")
    rows = list(csv.DictReader(io.StringIO(table.text)))
    assert {row["verb"] for row in rows} >= {"cluster.add"}
    assert (await client.get("/ui/audit/export?format=xml")).status == 400
    search = await client.get("/ui/audit?verb=cluster.add&user=a+b&since=2026-01-01T00:00")
    assert 'href="/ui/audit/export?format=csv&amp;user=a+b&amp;verb=cluster.add&amp;since=' in (
        search.text
    )


async def test_adding_a_user_asks_first_then_shows_the_token_once(
    server: RunningServer, client: ConsoleClient
) -> None:
    csrf = await signed_in_admin(server, client)
    asked = await client.post("/ui/users", {"csrf": csrf, "name": "carol", "groups": "dev"})
    assert asked.status == 200
    assert "Add user carol?" in asked.text
    _, users = await server.api("GET", "/api/v1/users")
    assert "carol" not in [user["name"] for user in users]
    done = await client.post(
        "/ui/users", {"csrf": csrf, "name": "carol", "groups": "dev", "confirmed": "yes"}
    )
    assert done.status == 200
    assert "User carol added" in done.text
    _, users = await server.api("GET", "/api/v1/users")
    assert {"name": "carol", "groups": ["dev"]}.items() <= next(
        user for user in users if user["name"] == "carol"
    ).items()
    _status, events = await server.api("GET", "/api/v1/audit?kind=admin")
    assert ("admin", "user.add", "carol") in [(e["user"], e["verb"], e["path"]) for e in events]


async def test_grant_and_ungrant_act_and_are_audited_as_tunnelctls(
    server: RunningServer, client: ConsoleClient
) -> None:
    await server.add_cluster("prod")
    await add_user(server, "ann")
    csrf = await signed_in_admin(server, client)
    form = {"csrf": csrf, "user": "ann", "cluster": "prod", "commands": "yes"}
    asked = await client.post("/ui/grants", form)
    assert "Grant ann access to prod with commands?" in asked.text
    assert csrf_of(asked.text) == csrf
    done = await client.post("/ui/grants", {**form, "confirmed": "yes"})
    assert done.status == 200, done.text
    _, grants = await server.api("GET", "/api/v1/grants?user=ann")
    assert [(g["cluster"], g["commands"]) for g in grants] == [("prod", True)]
    users = await client.get("/ui/users")
    assert 'data-grant="ann@prod"' in users.text
    removed = await client.post(
        "/ui/grants/remove", {"csrf": csrf, "user": "ann", "cluster": "prod", "confirmed": "yes"}
    )
    assert removed.status == 200
    assert "no longer has access" in removed.text
    _status, events = await server.api("GET", "/api/v1/audit?kind=admin&user=admin")
    verbs = [(e["verb"], e["path"]) for e in events]
    assert ("grant", "ann@prod") in verbs
    assert ("ungrant", "ann@prod") in verbs


async def test_a_kubeconfig_download_is_the_users_own_and_short_lived(
    server: RunningServer, client: ConsoleClient
) -> None:
    await server.add_cluster("prod")
    token = await add_user(server, "ann")
    status, _ = await server.api("PUT", "/api/v1/grants/ann/prod", {})
    assert status == 200
    await client.sign_in(token)
    csrf = await client.csrf("/ui/clusters/prod")
    answer = await client.post("/ui/clusters/prod/kubeconfig", {"csrf": csrf, "ttl": "1h"})
    assert answer.status == 200, answer.text
    assert answer.headers["Content-Disposition"] == 'attachment; filename="prod-ann.yaml"'
    assert "/k8s/clusters/prod" in answer.text
    assert "token: tat_" in answer.text
    status, events = await server.api("GET", "/api/v1/audit?kind=admin&user=ann")
    assert [(e["verb"], e["path"]) for e in events] == [("kubeconfig", "ann@prod")]


async def test_the_cluster_page_shows_what_its_agent_said_and_the_replica_it_reached(
    server: RunningServer, client: ConsoleClient, tmp_path: Path
) -> None:
    token = await server.add_cluster("prod")
    settings = agent_settings(server, "prod", token, tmp_path / "creds")
    agent = Agent(settings, DirectoryCredentialStore(tmp_path / "creds"))
    agent.facts[kinds.INFO_KUBERNETES_VERSION] = "v1.32.4"
    running = asyncio.create_task(agent.run())
    try:
        await agent.connected.wait()
        await until(lambda: server.context.registry.get("prod") is not None)
        await signed_in_admin(server, client)
        page = await client.get("/ui/clusters/prod")
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    assert '<dd id="cluster-kubernetes">v1.32.4</dd>' in page.text
    replica = server.context.replicas.name
    assert f'<dd id="cluster-replica">server replica {replica} (this one)</dd>' in page.text
