"""The console in a real browser (Chromium, Playwright) against a real server, agent and the
Kubernetes stand-in: sign-in, the fleet going live, a command's log streaming in and its
cancel, a grant taken away, CSRF and the cookie, another user's pages out of reach."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, expect

from tests.console.browser import (
    Fleet,
    chromium,
    fleet_of,
    new_context,
    row,
    screenshot,
    sign_in,
)
from tests.console.support import add_user, grant
from tests.integration.harness import RunningServer
from tunnel_pki.tls import client_context
from tunnel_server.clock import utcnow
from tunnel_server.console.sessions import COOKIE
from tunnel_server.console.state import CONSOLE

pytestmark = pytest.mark.timeout(180)

SPEC = """\
apiVersion: tunnel/v1
type: query
name: {name}
spec:
  get: {{apiVersion: v1, kind: Namespace, name: default}}
"""


@pytest.fixture
async def fleet(server: RunningServer, tmp_path: Path) -> AsyncIterator[Fleet]:
    server.runner.app[CONSOLE].poll_interval = 0.2  # the live page sooner; still batched
    async with fleet_of(server, tmp_path) as running:
        yield running


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with chromium() as running:
        yield running


async def tunnelctl(server: RunningServer, tmp_path: Path, token: str, *args: str) -> str:
    """Run the real tunnelctl against the server; its standard output."""
    token_file = tmp_path / "ctl-token"
    token_file.write_text(token)
    ca = tmp_path / "ctl-ca.crt"
    ca.write_bytes(server.ca_pem)
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "tunnelctl"),
        "--server",
        server.url,
        "--ca",
        str(ca),
        "--token-file",
        str(token_file),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    return out.decode()


async def dispatch(fleet: Fleet, token: str, name: str) -> str:
    """``tunnelctl run`` a scripted command on prod-eu; its id."""
    spec = fleet.tmp_path / f"{name}.yaml"
    spec.write_text(SPEC.format(name=name))
    out = await tunnelctl(
        fleet.server,
        fleet.tmp_path,
        token,
        "run",
        "--cluster",
        "prod-eu",
        "-f",
        str(spec),
        "-o",
        "json",
    )
    command_id: str = json.loads(out)["id"]
    return command_id


async def test_sign_in_then_a_cluster_turns_connected_without_a_reload(
    fleet: Fleet, browser: Browser, tmp_path: Path
) -> None:
    # Two more clusters: a namespaced one whose agent, last seen, was out of date.
    status, _ = await fleet.server.api(
        "POST",
        "/api/v1/clusters",
        {"name": "edge-ap", "rbac": "namespaced", "namespaces": ["shop"]},
    )
    assert status == 201
    await fleet.server.context.store.record_connection("edge-ap", "0.0.9", None, None, utcnow())
    await fleet.server.add_cluster("staging")
    context = await new_context(browser, fleet.server)
    page = await context.new_page()
    await page.goto("/ui/")
    await expect(page).to_have_url("/ui/sign-in")
    await screenshot(page, tmp_path, "sign-in")
    await sign_in(page, fleet.server.admin_token)
    prod = row(page, "prod-eu")
    await expect(prod.locator("td.state")).to_contain_text("offline")
    await expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
    await page.evaluate("window.notReloaded = true")

    await fleet.start_agent()
    await expect(prod.locator("td.state")).to_contain_text("connected")
    await expect(page.locator("#fleet-connected")).to_have_text("1")
    await expect(row(page, "edge-ap")).to_contain_text("out of date")
    await expect(row(page, "edge-ap")).to_contain_text("namespaced: shop")
    await page.get_by_label("Show").select_option("disconnected")  # filtered live, here
    await expect(page.locator("#fleet-rows tr")).to_have_count(2)
    await page.get_by_label("Show").select_option("")
    assert await page.evaluate("window.notReloaded === true")  # the same page, updated live
    await screenshot(page, tmp_path, "fleet")
    dark = await new_context(browser, fleet.server, dark=True)
    night = await dark.new_page()
    await sign_in(night, fleet.server.admin_token)
    await expect(row(night, "prod-eu").locator("td.state")).to_contain_text("connected")
    await screenshot(night, tmp_path, "fleet-dark")

    # The session: a cookie scripts cannot read, sent only over TLS, only same-site.
    cookies = {cookie["name"]: cookie for cookie in await context.cookies()}
    session = cookies[COOKIE]
    assert session["httpOnly"]
    assert session["secure"]
    assert session["sameSite"] == "Strict"
    assert session["expires"] > 0  # it expires
    assert COOKIE not in await page.evaluate("document.cookie")
    storage = await page.evaluate("[localStorage.length, sessionStorage.length]")
    assert storage == [0, 0]
    assert fleet.server.admin_token not in await page.content()


async def test_a_commands_log_streams_into_its_open_page_and_cancel_works(
    fleet: Fleet, browser: Browser, tmp_path: Path
) -> None:
    await fleet.start_agent()
    token = await add_user(fleet.server, "ann")
    await grant(fleet.server, "ann", "prod-eu", commands=True)
    command_id = await dispatch(fleet, token, "stream-report")
    page = await (await new_context(browser, fleet.server)).new_page()
    await sign_in(page, token)
    await page.goto(f"/ui/commands/{command_id}")
    log = page.locator("#command-log")
    await expect(log).to_contain_text("stream-report: started on attempt 1")
    await expect(page.locator("#command-state")).to_have_text("running")
    await page.evaluate("window.notReloaded = true")
    fleet.script.gate.set()  # the command goes on: its next line and its end stream in
    await expect(log).to_contain_text("the gate opened; finishing")
    await expect(page.locator("#command-state")).to_have_text("succeeded")
    await expect(page.locator("#command-outputs")).to_have_text("report")
    assert await page.evaluate("window.notReloaded === true")
    await screenshot(page, tmp_path, "command")

    hanging = await dispatch(fleet, token, "hang-forever")
    await page.goto(f"/ui/commands/{hanging}")
    await expect(page.locator("#command-log")).to_contain_text("hang-forever: started")
    await page.get_by_role("button", name="Cancel this command").click()
    await expect(page.locator("#question")).to_contain_text("Cancel command hang-forever?")
    await screenshot(page, tmp_path, "confirm")
    await page.get_by_role("button", name="Confirm").click()
    await expect(page).to_have_url(f"/ui/commands/{hanging}")
    await expect(page.locator("#command-state")).to_have_text("cancelled")
    assert hanging in fleet.script.cancelled
    await page.goto("/ui/commands")
    await expect(page.get_by_role("link", name="hang-forever")).to_be_visible()
    await screenshot(page, tmp_path, "commands")


async def test_a_revoked_grant_makes_the_cluster_vanish_for_that_user(
    fleet: Fleet, browser: Browser, tmp_path: Path
) -> None:
    await fleet.server.add_cluster("dev-us")
    token = await add_user(fleet.server, "ann")
    await grant(fleet.server, "ann", "prod-eu")
    await grant(fleet.server, "ann", "dev-us")
    ann = await (await new_context(browser, fleet.server)).new_page()
    await sign_in(ann, token)
    await expect(row(ann, "dev-us")).to_have_count(1)
    await expect(ann.locator("#live-status")).to_have_attribute("data-state", "live")

    # An admin takes the grant away in the console, confirming first.
    admin = await (await new_context(browser, fleet.server)).new_page()
    await sign_in(admin, fleet.server.admin_token)
    await admin.goto("/ui/users")
    await screenshot(admin, tmp_path, "users")
    await admin.get_by_role("button", name="Ungrant ann on dev-us").click()
    await expect(admin.locator("#question")).to_contain_text("Take ann's access to dev-us away?")
    await admin.get_by_role("button", name="Confirm").click()
    await expect(admin.get_by_role("status")).to_contain_text("no longer has access to dev-us")

    await expect(row(ann, "dev-us")).to_have_count(0)  # gone from ann's open page, live
    await expect(row(ann, "prod-eu")).to_have_count(1)
    status, events = await fleet.server.api("GET", "/api/v1/audit?kind=admin")
    assert status == 200
    assert [e["path"] for e in events if e["verb"] == "ungrant"] == ["ann@dev-us"]
    await admin.goto("/ui/audit?kind=admin&verb=ungrant")
    await expect(admin.locator("table.audit tbody tr")).to_have_count(1)
    await expect(admin.locator("table.audit tbody")).to_contain_text("ann@dev-us")
    await screenshot(admin, tmp_path, "audit")


async def test_a_user_cannot_reach_another_clusters_pages_or_events_by_url(
    fleet: Fleet, browser: Browser, tmp_path: Path
) -> None:
    await fleet.start_agent()
    await fleet.server.add_cluster("dev-us")
    admin_command = await dispatch(fleet, fleet.server.admin_token, "hang-admins")
    token = await add_user(fleet.server, "ann")
    await grant(fleet.server, "ann", "dev-us")
    page = await (await new_context(browser, fleet.server)).new_page()
    await sign_in(page, token)
    await expect(row(page, "dev-us")).to_have_count(1)
    await expect(row(page, "prod-eu")).to_have_count(0)
    for path in ("/ui/clusters/prod-eu", f"/ui/commands/{admin_command}"):
        answer = await page.goto(path)
        assert answer is not None
        assert answer.status == 404, path
    await screenshot(page, tmp_path, "not-found")
    for path in ("/ui/users", "/ui/audit"):
        answer = await page.goto(path)
        assert answer is not None
        assert answer.status == 403, path
    await page.goto("/ui/")
    # The live streams, asked for by URL from the page, give nothing of prod-eu.
    command_events = await page.evaluate(
        "async (id) => (await fetch('/ui/events/commands/' + id)).status", admin_command
    )
    assert command_events == 404
    first_event = await page.evaluate(
        """async () => {
            const response = await fetch('/ui/events/fleet');
            const reader = response.body.getReader();
            const { value } = await reader.read();
            await reader.cancel();
            return new TextDecoder().decode(value);
        }"""
    )
    assert "dev-us" in first_event
    assert "prod-eu" not in first_event


async def test_state_changes_need_the_csrf_token(
    fleet: Fleet, browser: Browser, tmp_path: Path
) -> None:
    await add_user(fleet.server, "ann")
    context = await new_context(browser, fleet.server)
    page = await context.new_page()
    await sign_in(page, fleet.server.admin_token)
    # The session cookie goes along (same site), but not the form's token: refused.
    refused = await page.evaluate(
        """async () => (await fetch('/ui/grants', {method: 'POST',
            headers: {'Content-Type': 'application/x-www-form-urlencoded'},
            body: 'user=ann&cluster=prod-eu&confirmed=yes'})).status"""
    )
    assert refused == 403
    _status, grants = await fleet.server.api("GET", "/api/v1/grants")
    assert grants == []
    # Framing is refused too (X-Frame-Options, frame-ancestors).
    answer = await page.goto("/ui/")
    assert answer is not None
    headers = await answer.all_headers()
    assert headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    # Signing out ends the session on the server: the old page's next request is sent away.
    await page.get_by_role("button", name="Sign out").click()
    await expect(page).to_have_url("/ui/sign-in")
    await page.goto("/ui/")
    await expect(page).to_have_url("/ui/sign-in")


async def test_an_admin_ends_a_request_in_progress_from_the_cluster_page(
    fleet: Fleet, browser: Browser, tmp_path: Path
) -> None:
    await fleet.start_agent()
    server = fleet.server
    token = await add_user(server, "ann")
    await grant(server, "ann", "prod-eu")
    assert server._http is not None
    watch = server._http.get(
        f"{server.url}/k8s/clusters/prod-eu/api/v1/namespaces/default/pods?watch=1",
        headers={"Authorization": f"Bearer {token}"},
        ssl=client_context(server.ca_pem),
    )
    async with watch as response:
        assert response.status == 200
        page = await (await new_context(browser, server)).new_page()
        await sign_in(page, server.admin_token)
        await page.goto("/ui/clusters/prod-eu")
        await expect(page.locator("#cluster-state")).to_contain_text("connected")
        end = page.get_by_role("button", name="End ann's watch")
        await expect(end).to_be_visible()
        await screenshot(page, tmp_path, "cluster")
        await end.click()
        await page.get_by_role("button", name="Confirm").click()
        await expect(page.get_by_role("status")).to_contain_text("The request was ended")
        tail = await response.content.read()  # the watch ends, saying why
        assert b"ended by admin in the console" in tail
    status, events = await server.api("GET", "/api/v1/audit?kind=admin")
    assert status == 200
    assert [e["path"] for e in events if e["verb"] == "request.end"] == ["ann@prod-eu"]
