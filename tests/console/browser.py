"""The console in a real browser: Debian's Chromium driven by Playwright, against a real
server, a real agent and the Kubernetes stand-in, all on loopback.

Playwright cannot download its own browser here; the tests launch the system's
Chromium (``TUNNEL_TEST_CHROMIUM``, default ``/usr/bin/chromium``; scripts/test
installs it through scripts/browser.sh). Without it the tests fail, saying so: a
skipped test proves nothing.

The agent serves kubectl's requests with its real relay (``KubeProxy``) in front
of the stand-in, and commands with its real runner (journal, reports, cancel);
the executor is scripted (:class:`Script`), so that a test decides when a
command logs and ends. Screenshots go to the test's own directory and, when
``TUNNEL_CONSOLE_SCREENSHOTS`` names a directory (docs/console), there too.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, BrowserContext, Page, async_playwright, expect

from protocol import kinds
from tests.integration.harness import RunningServer, agent_settings, running_agent
from tests.kubestub import KubeStub
from tunnel_agent.credentials import DirectoryCredentialStore
from tunnel_agent.journal import Journal
from tunnel_agent.kubeapi import KubeApi, load_kube_configuration
from tunnel_agent.kubeproxy import KubeProxy
from tunnel_agent.policy import ProxyPolicy
from tunnel_agent.router import StreamRouter
from tunnel_agent.runner import CommandRunner, JobContext, RunnerSettings
from tunnel_commands import CommandSpecError, parse_command

CHROMIUM_VARIABLE = "TUNNEL_TEST_CHROMIUM"
SCREENSHOTS_VARIABLE = "TUNNEL_CONSOLE_SCREENSHOTS"
#: How long the browser waits for what a test expects to appear (it polls the page).
EXPECT_TIMEOUT = 15_000

expect.set_options(timeout=EXPECT_TIMEOUT)


@dataclass
class Script:
    """The agent's scripted executor: ``stream-*`` logs a line, waits for :attr:`gate`,
    logs another and succeeds with an output; ``hang-*`` logs and runs until cancelled."""

    gate: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: list[str] = field(default_factory=list)

    async def execute(self, spec: dict[str, Any], context: JobContext) -> dict[str, Any]:
        name = spec["name"]
        try:
            context.log(f"{name}: started on attempt {context.attempt}")
            if name.startswith("hang-"):
                await asyncio.Event().wait()
            await self.gate.wait()
            context.log(f"{name}: the gate opened; finishing")
            return {"outcome": "succeeded", "summary": {"lines": 2}, "outputs": ["report"]}
        except asyncio.CancelledError:
            self.cancelled.append(context.command_id)
            raise


def _validate(spec: dict[str, Any]) -> None:
    try:
        parse_command(spec)
    except CommandSpecError as exc:
        raise ValueError(str(exc)) from exc


@dataclass
class Fleet:
    """A server with cluster ``prod-eu`` registered, and its agent, started on demand."""

    server: RunningServer
    stub: KubeStub
    script: Script
    tmp_path: Path
    bootstrap: str
    stack: contextlib.AsyncExitStack

    async def start_agent(self) -> None:
        """Start prod-eu's agent (relay and command runner) and wait until it is connected."""
        api = KubeApi(
            await load_kube_configuration(self.stub.write_kubeconfig(self.tmp_path / "agent.kc"))
        )
        self.stack.push_async_callback(api.close)
        proxy = KubeProxy(api, ProxyPolicy())
        self.stack.push_async_callback(proxy.close)
        runner = CommandRunner(
            self.script.execute,
            _validate,
            Journal(DirectoryCredentialStore(self.tmp_path / "creds")),
            RunnerSettings(concurrency=2, heartbeat=0.5),
        )
        router = StreamRouter()
        router.add(kinds.STREAM_HTTP, proxy.handle)
        router.add(kinds.STREAM_COMMAND, runner.handle_offer)
        runner_task = asyncio.create_task(runner.run())

        async def stop_runner() -> None:
            runner_task.cancel()
            await asyncio.gather(runner_task, return_exceptions=True)

        self.stack.push_async_callback(stop_runner)
        settings = agent_settings(self.server, "prod-eu", self.bootstrap, self.tmp_path / "creds")
        agent = await self.stack.enter_async_context(
            running_agent(
                settings,
                on_stream=router,
                on_message=runner.on_message,
                on_connected=runner.connected,
                on_disconnected=runner.disconnected,
            )
        )
        await agent.wait_connected()


@contextlib.asynccontextmanager
async def fleet_of(server: RunningServer, tmp_path: Path) -> AsyncIterator[Fleet]:
    async with KubeStub() as stub, contextlib.AsyncExitStack() as stack:
        stub.add_pod("web")
        bootstrap = await server.add_cluster("prod-eu")
        yield Fleet(server, stub, Script(), tmp_path, bootstrap, stack)


@contextlib.asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    """Debian's Chromium, headless, driven by Playwright."""
    path = os.environ.get(CHROMIUM_VARIABLE) or "/usr/bin/chromium"
    if not os.access(path, os.X_OK):
        pytest.fail(
            f"no Chromium at {path} for the console's browser tests: apt-get install chromium"
            f" (scripts/test does, through scripts/browser.sh), or point {CHROMIUM_VARIABLE}"
            " at one",
            pytrace=False,
        )
    async with async_playwright() as playwright:
        # Root in a container has no user namespaces for Chromium's sandbox.
        browser = await playwright.chromium.launch(executable_path=path, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            await browser.close()


async def new_context(
    browser: Browser, server: RunningServer, *, dark: bool = False
) -> BrowserContext:
    """A fresh browser profile (its own cookies) that trusts the test server."""
    return await browser.new_context(
        base_url=server.url,
        ignore_https_errors=True,  # the server's own CA; the TLS itself is real
        viewport={"width": 1280, "height": 760},
        color_scheme="dark" if dark else "light",
    )


async def sign_in(page: Page, token: str) -> None:
    """Sign in as a person does: the console's address, the token pasted, the button."""
    await page.goto("/ui/")
    await expect(page).to_have_url("/ui/sign-in")
    await page.get_by_label("API token").fill(token)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("heading", name="Fleet")).to_be_visible()


async def screenshot(page: Page, tmp_path: Path, name: str) -> Path:
    """A full-page screenshot in the test's directory (and the docs', when asked)."""
    path = tmp_path / "screenshots" / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    docs = os.environ.get(SCREENSHOTS_VARIABLE)
    if docs:
        os.makedirs(docs, exist_ok=True)
        shutil.copyfile(path, os.path.join(docs, path.name))
    return path


def row(page: Page, cluster: str) -> Any:
    """The fleet table's row of ``cluster``."""
    return page.locator(f'#fleet-rows tr[data-name="{cluster}"]')
