"""The agent reaches the server through an HTTP CONNECT proxy set in the environment.

A real server and a real proxy on loopback; the agent finds the proxy the way
it does in a cluster: HTTPS_PROXY (with user:password) and NO_PROXY.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tunnel_agent.config import AgentSettings
from tunnel_agent.errors import TlsInterceptionError

from ..support import until
from .harness import RunningServer, agent_settings, running_agent
from .proxies import interception_context, running_proxy

USER = "agent-proxy-user"
PASSWORD = "proxy-pa55-d0-not-leak"

#: Turns of the event loop to wait through a few real reconnection delays.
PATIENCE = 10**7


@pytest.fixture(autouse=True)
def no_proxy_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start each test without proxy settings (this machine may have some)."""
    for name in list(os.environ):
        if name.lower().endswith("_proxy"):
            monkeypatch.delenv(name)


@pytest.fixture
def agent_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Every log record of the test, checked at the end for the proxy password."""
    caplog.set_level(logging.DEBUG)
    yield caplog
    # Whatever happened, no log line (agent, aiohttp or other) shows the proxy password.
    for record in caplog.records:
        assert PASSWORD not in record.getMessage()


def fast_retries(settings: AgentSettings) -> AgentSettings:
    connect = dataclasses.replace(settings.connect, backoff_base=0.01, backoff_cap=0.05)
    return dataclasses.replace(settings, connect=connect)


async def bootstrapped(server: RunningServer, cluster: str, credentials: Path) -> AgentSettings:
    """Settings of an agent that already holds its certificate (bootstrapped without a proxy)."""
    token = await server.add_cluster(cluster)
    settings = agent_settings(server, cluster, token, credentials)
    async with running_agent(settings) as running:
        await running.wait_connected()
    return fast_retries(dataclasses.replace(settings, bootstrap_token=None))


async def test_fresh_agent_bootstraps_and_connects_through_the_proxy(
    server: RunningServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    agent_logs: pytest.LogCaptureFixture,
) -> None:
    token = await server.add_cluster("prod-eu")
    settings = agent_settings(server, "prod-eu", token, tmp_path / "creds")
    async with running_proxy(credentials=(USER, PASSWORD)) as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url(USER, PASSWORD))
        async with running_agent(settings) as running:
            await running.wait_connected()
            assert running.agent.bootstraps == 1
            await until(lambda: server.context.registry.get("prod-eu") is not None)
            assert (await server.cluster("prod-eu"))["connected"] is True
    # Bootstrap and the agent socket both went through it, with the credentials.
    target = f"127.0.0.1:{server.port}"
    assert proxy.connects == [target, target]
    assert proxy.authorizations == [(USER, PASSWORD), (USER, PASSWORD)]
    assert proxy.refused == 0


async def test_wrong_proxy_credentials_keep_the_agent_retrying_with_a_useful_message(
    server: RunningServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    agent_logs: pytest.LogCaptureFixture,
) -> None:
    settings = await bootstrapped(server, "prod-eu", tmp_path / "creds")
    async with running_proxy(credentials=(USER, "the-right-one")) as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url(USER, PASSWORD))
        async with running_agent(settings) as running:
            agent = running.agent
            await until(
                lambda: proxy.refused >= 3 and agent.backoff.attempt >= 3, max_turns=PATIENCE
            )
            assert not agent.connected.is_set()
            assert agent.connections == 0
            assert not running.task.done()  # it keeps retrying
            message = agent.last_error
    assert proxy.connects == []
    assert message is not None
    # aiohttp raises ClientHttpProxyError(407); the agent names the status and the proxy.
    assert "407" in message
    assert "Proxy Authentication Required" in message
    assert f"127.0.0.1:{proxy.port}" in message
    assert PASSWORD not in message


async def test_no_proxy_makes_the_agent_bypass_the_proxy(
    server: RunningServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    agent_logs: pytest.LogCaptureFixture,
) -> None:
    token = await server.add_cluster("prod-eu")
    settings = agent_settings(server, "prod-eu", token, tmp_path / "creds")
    async with running_proxy(credentials=(USER, PASSWORD)) as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url(USER, PASSWORD))
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        async with running_agent(settings) as running:
            await running.wait_connected()
            assert running.agent.bootstraps == 1
    assert proxy.connects == []
    assert proxy.authorizations == []


async def test_tls_intercepting_proxy_is_named_and_the_agent_never_connects(
    server: RunningServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    agent_logs: pytest.LogCaptureFixture,
) -> None:
    settings = await bootstrapped(server, "prod-eu", tmp_path / "creds")
    agent_logs.clear()
    async with running_proxy(intercept=interception_context("127.0.0.1")) as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url(USER, PASSWORD))
        async with running_agent(settings) as running:
            agent = running.agent
            await until(lambda: agent.backoff.attempt >= 3, max_turns=PATIENCE)
            assert agent.connections == 0
            assert not agent.connected.is_set()
            message = agent.last_error
    assert proxy.intercepted >= 3
    assert message is not None
    assert "intercepting TLS" in message
    assert proxy.url() in message  # the proxy, without its credentials
    assert PASSWORD not in message
    failures = [r for r in agent_logs.records if r.getMessage().startswith("cannot connect")]
    assert len(failures) >= 3
    for record in failures:
        assert isinstance(record.args, tuple)
        assert isinstance(record.args[0], TlsInterceptionError)


async def test_tls_intercepting_proxy_stops_a_fresh_agent_from_bootstrapping(
    server: RunningServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    agent_logs: pytest.LogCaptureFixture,
) -> None:
    token = await server.add_cluster("prod-eu")
    settings = fast_retries(agent_settings(server, "prod-eu", token, tmp_path / "creds"))
    async with running_proxy(intercept=interception_context("127.0.0.1")) as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url(USER, PASSWORD))
        async with running_agent(settings) as running:
            agent = running.agent
            await until(lambda: agent.backoff.attempt >= 3, max_turns=PATIENCE)
            assert agent.bootstraps == 0
            assert agent.connections == 0
    assert not (tmp_path / "creds" / "tls.crt").exists()
    failures = [r for r in agent_logs.records if r.getMessage().startswith("bootstrap failed")]
    assert len(failures) >= 3
    for record in failures:
        assert isinstance(record.args, tuple)
        error = record.args[0]
        assert isinstance(error, TlsInterceptionError)
        assert proxy.url() in str(error)
    # TLS failed before the token was sent, so the proxy never saw it: it is still good.
    monkeypatch.delenv("HTTPS_PROXY")
    async with running_agent(settings) as running:
        await running.wait_connected()
        assert running.agent.bootstraps == 1
