"""A user sees only the clusters they hold a grant on, in pages and in live updates;
an admin sees all (real TLS server; no agent needed)."""

from __future__ import annotations

from tests.console.support import ConsoleClient, add_user, grant
from tests.integration.harness import RunningServer
from tunnel_server.console.state import CONSOLE


async def test_the_fleet_shows_a_user_only_their_granted_clusters(
    server: RunningServer, client: ConsoleClient
) -> None:
    await server.add_cluster("prod")
    await server.add_cluster("secret-lab")
    token = await add_user(server, "ann")
    await grant(server, "ann", "prod")
    await client.sign_in(token)
    fleet = await client.get("/ui/")
    assert 'data-name="prod"' in fleet.text
    assert "secret-lab" not in fleet.text
    admin = ConsoleClient(server)
    try:
        await admin.sign_in(server.admin_token)
        everything = await admin.get("/ui/")
        assert 'data-name="prod"' in everything.text
        assert 'data-name="secret-lab"' in everything.text
    finally:
        await admin.close()


async def test_another_clusters_pages_answer_as_if_it_did_not_exist(
    server: RunningServer, client: ConsoleClient
) -> None:
    await server.add_cluster("prod")
    await server.add_cluster("secret-lab")
    token = await add_user(server, "ann")
    await grant(server, "ann", "prod")
    await client.sign_in(token)
    assert (await client.get("/ui/clusters/prod")).status == 200
    hidden = await client.get("/ui/clusters/secret-lab")
    missing = await client.get("/ui/clusters/no-such-cluster")
    assert hidden.status == missing.status == 404
    assert hidden.text.replace("secret-lab", "X") == missing.text.replace("no-such-cluster", "X")
    csrf = await client.csrf()
    kubeconfig = await client.post("/ui/clusters/secret-lab/kubeconfig", {"csrf": csrf})
    assert kubeconfig.status == 404
    assert "apiVersion" not in kubeconfig.text
    commands = await client.get("/ui/commands?cluster=secret-lab")
    assert commands.status == 200
    assert "No command to show" in commands.text


async def test_admin_pages_are_for_admins(server: RunningServer, client: ConsoleClient) -> None:
    token = await add_user(server, "ann")
    await client.sign_in(token)
    for path in ("/ui/users", "/ui/audit", "/ui/audit/export?format=csv"):
        assert (await client.get(path)).status == 403, path
    csrf = await client.csrf()
    answer = await client.post("/ui/grants", {"csrf": csrf, "user": "ann", "cluster": "x"})
    assert answer.status == 403
    status, grants = await server.api("GET", "/api/v1/grants")
    assert status == 200
    assert grants == []


async def test_live_updates_carry_only_granted_clusters_and_drop_a_revoked_one(
    server: RunningServer, client: ConsoleClient
) -> None:
    server.runner.app[CONSOLE].poll_interval = 0.05
    for name in ("prod", "dev", "secret-lab"):
        await server.add_cluster(name)
    token = await add_user(server, "ann")
    await grant(server, "ann", "prod")
    await grant(server, "ann", "dev")
    await client.sign_in(token)
    async with client.events("/ui/events/fleet") as events:
        first = await events.until("fleet")
        assert first["full"]
        assert sorted(row["name"] for row in first["rows"]) == ["dev", "prod"]
        status, _ = await server.api("DELETE", "/api/v1/grants/ann/dev")
        assert status == 200
        update = await events.until("fleet", lambda data: bool(data["removed"]))
        assert update["removed"] == ["dev"]
        assert all(row["name"] != "secret-lab" for row in update["rows"])


async def test_live_updates_stop_when_the_session_ends(
    server: RunningServer, client: ConsoleClient
) -> None:
    server.runner.app[CONSOLE].poll_interval = 0.05
    token = await add_user(server, "ann")
    await client.sign_in(token)
    async with client.events("/ui/events/fleet") as events:
        await events.until("fleet")
        status, _ = await server.api("DELETE", "/api/v1/users/ann/tokens")
        assert status == 200
        assert await events.until("signed-out") == {}


async def test_events_need_a_session(client: ConsoleClient) -> None:
    answer = await client.get("/ui/events/fleet")
    assert answer.status == 401
