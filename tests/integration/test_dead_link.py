"""A request does not wait out the keepalive on a link that went dead without a word.

A NAT or firewall that forgets the agent's flow closes nothing: the server's
socket stays open and the agent's bytes stop coming. A request sent then would
wait on the keepalive (a PING after 15 s of silence, 15 s for its PONG): the
20-30 s hang users know from other tunnels. The server sends a PING with the
request instead, and drops the agent when that one goes unanswered.

A real server and agent, the agent's socket through a CONNECT proxy on loopback
that can turn every tunnel open into a black hole.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from protocol import Keepalive, kinds
from tunnel_agent.kubeproxy import KubeProxy
from tunnel_agent.policy import ProxyPolicy
from tunnel_agent.router import StreamRouter
from tunnel_pki.tls import client_context

from ..kubestub_tests.kubectl import Kubectl
from ..support import until
from .harness import RunningServer, agent_settings, running_agent, running_server, server_settings
from .proxies import ConnectProxy, running_proxy
from .test_kubeproxy_relay import agent_kube_api
from .test_observability import server_metrics
from .test_proxy import no_proxy_environment

__all__ = ["no_proxy_environment"]  # autouse: no proxy settings of this machine's
from .upstream import running_upstream

#: A keepalive that cannot be what ends these requests, and a short probe.
SERVER_KEEPALIVE = Keepalive(interval=60.0, timeout=60.0, probe_after=0.05, probe_timeout=2.0)
#: The agent notices the dead link by its own keepalive, and dials again: later
#: than the server's probe, so that the request meets the dead link.
AGENT_KEEPALIVE = Keepalive(interval=4.0, timeout=4.0)
#: An agent that never pings during a test: the server's probe is all there is.
QUIET_AGENT = Keepalive(interval=60.0, timeout=60.0)


@dataclass
class Link:
    server: RunningServer
    proxy: ConnectProxy
    token: str
    http: aiohttp.ClientSession

    async def get(self, path: str) -> tuple[int, Any]:
        async with self.http.get(
            f"{self.server.url}/k8s/clusters/prod-eu{path}",
            headers={"Authorization": f"Bearer {self.token}"},
            ssl=client_context(self.server.ca_pem),
        ) as response:
            return response.status, await response.json()

    def agent_session(self) -> Any:
        registered = self.server.context.registry.get("prod-eu")
        return None if registered is None else registered.session


@pytest.fixture
async def link(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Link]:
    """``request.param``: the agent's keepalive (AGENT_KEEPALIVE by default)."""
    settings = server_settings(tmp_path / "state")
    settings = dataclasses.replace(
        settings, tunnel=dataclasses.replace(settings.tunnel, keepalive=SERVER_KEEPALIVE)
    )
    async with running_server(settings) as server:
        bootstrap = await server.add_cluster("prod-eu")
        status, user = await server.api("POST", "/api/v1/users", {"name": "alice"})
        assert status == 201
        status, _ = await server.api("PUT", "/api/v1/grants/alice/prod-eu", {})
        assert status == 200
        async with running_upstream() as upstream, running_proxy() as proxy:
            monkeypatch.setenv("HTTPS_PROXY", proxy.url())
            api = agent_kube_api(upstream)
            kube = KubeProxy(api, ProxyPolicy())
            router = StreamRouter()
            router.add(kinds.STREAM_HTTP, kube.handle)
            agent = agent_settings(
                server,
                "prod-eu",
                bootstrap,
                tmp_path / "creds",
                keepalive=getattr(request, "param", AGENT_KEEPALIVE),
            )
            async with running_agent(agent, on_stream=router) as running:
                await running.wait_connected()
                await until(lambda: server.context.registry.get("prod-eu") is not None)
                async with aiohttp.ClientSession() as http:
                    yield Link(server, proxy, user["token"], http)
            await kube.close()
            await api.close()


async def quiet_for_the_probe(link: Link) -> None:
    """Until the server has heard nothing from the agent for ``probe_after``."""
    session = link.agent_session()
    assert session is not None
    liveness = session.connection._liveness

    def quiet() -> bool:
        last = liveness.last_received
        return last is not None and session._clock() - last >= SERVER_KEEPALIVE.probe_after

    await until(quiet, max_turns=10**8)


async def test_a_request_on_a_dead_link_fails_fast_with_503_saying_why(link: Link) -> None:
    status, _ = await link.get("/api/v1/namespaces/default/pods/p")
    assert status == 200  # the link works
    assert link.proxy.blackhole() == 1
    await quiet_for_the_probe(link)
    session = link.agent_session()
    loop = asyncio.get_running_loop()
    started = loop.time()

    status, body = await link.get("/api/v1/namespaces/default/pods/p")

    # Not the keepalive (its PING would go out only after 60 s of silence): the
    # PING sent with the request found the dead link, and woke the session's
    # timer for its 2 s deadline.
    assert loop.time() - started < SERVER_KEEPALIVE.interval / 2
    assert status == 503
    assert body["reason"] == "ServiceUnavailable"
    assert body["message"].startswith("the agent of cluster prod-eu stopped answering")
    assert "did not answer a PING within 2s" in body["message"]
    assert session.close_reason is not None
    assert "within 2s" in session.close_reason
    # For the operator: a session dropped on a dead link is counted as such, once
    # its tear-down is over (its close waits for the peer's reply up to 2 s).
    await session.close()
    timeouts = 0.0
    for _ in range(10):  # the socket's handler counts it a few turns later
        timeouts = (await server_metrics(link.server))[("tunnel_server_agent_timeouts_total", ())]
        if timeouts:
            break
    assert timeouts == 1


async def test_after_a_dead_link_the_agent_dials_again_and_requests_work(link: Link) -> None:
    link.proxy.blackhole()
    await quiet_for_the_probe(link)
    status, _ = await link.get("/api/v1/namespaces/default/pods/p")
    assert status == 503

    # The agent notices by its own keepalive, and dials again through the proxy.
    await until(lambda: len(link.proxy.connects) >= 2, max_turns=10**8)
    await until(lambda: link.agent_session() is not None, max_turns=10**8)

    status, body = await link.get("/api/v1/namespaces/default/pods/p")
    assert status == 200, body


@pytest.mark.parametrize("link", [QUIET_AGENT], indirect=True)
async def test_a_request_on_a_live_but_quiet_link_is_answered(link: Link) -> None:
    await quiet_for_the_probe(link)
    session = link.agent_session()
    rtt_before = session.connection.rtt

    status, _ = await link.get("/api/v1/namespaces/default/pods/p")

    assert status == 200
    # The probe went out with the request and its PONG came back: the session stays.
    await until(lambda: session.connection.rtt != rtt_before, max_turns=10**7)
    assert link.agent_session() is session
    assert session.close_reason is None
    metrics = await server_metrics(link.server)
    assert metrics[("tunnel_server_agent_timeouts_total", ())] == 0


async def test_kubectl_on_a_dead_link_reports_it_and_does_not_retry(
    link: Link, tmp_path: Path
) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_bytes(link.server.ca_pem)
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "prod-eu",
                "cluster": {
                    "server": f"{link.server.url}/k8s/clusters/prod-eu",
                    "certificate-authority": str(ca),
                },
            }
        ],
        "users": [{"name": "alice", "user": {"token": link.token}}],
        "contexts": [{"name": "prod-eu", "context": {"cluster": "prod-eu", "user": "alice"}}],
        "current-context": "prod-eu",
    }
    (tmp_path / "kubectl").mkdir()
    (tmp_path / "kc.yaml").write_text(yaml.safe_dump(kubeconfig))
    kubectl = Kubectl(tmp_path / "kc.yaml", tmp_path / "kubectl", tmp_path / "kubectl")
    pod = "/k8s/clusters/prod-eu/api/v1/namespaces/default/pods/p"
    assert (await kubectl.run("get", "--raw", pod)).returncode == 0
    link.proxy.blackhole()
    await quiet_for_the_probe(link)

    result = await kubectl.run("get", "--raw", pod)

    # kubectl prints the answer to its last attempt: had the 503 asked for a
    # retry, that would be "not connected" after ten more, a second apart.
    assert result.returncode != 0
    assert (
        "Error from server (ServiceUnavailable): the agent of cluster prod-eu stopped answering"
        in result.stderr
    )
