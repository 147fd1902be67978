"""A read-only, namespace-scoped agent through the whole tunnel: what it refuses never reaches
the API server (each case was let through before; found by a review of the agent's policy)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tunnel_agent.policy import ProxyPolicy
from tunnel_pki.tls import client_context

from .harness import RunningServer
from .test_kubeproxy_relay import Tunnel, running_tunnel

POLICY = ProxyPolicy(read_only=True, namespaces=frozenset({"team"}))


@pytest.fixture
async def tunnel(server: RunningServer, tmp_path: Path) -> AsyncIterator[Tunnel]:
    async with running_tunnel(server, tmp_path, POLICY, {"name": "alice"}, {}) as running:
        yield running


CONSOLE = "/apis/subresources.kubevirt.io/v1/namespaces/team/virtualmachineinstances/vm/console"


# KubeVirt's serial console: verb get on virtualmachineinstances/console, over a
# WebSocket; with ?watch=true it is still a get to the API server (a watch is of a
# collection), which read it as a watch here before.
@pytest.mark.parametrize("path", [CONSOLE, CONSOLE + "?watch=true"])
async def test_a_console_on_a_subresource_read_as_a_get_is_not_opened(
    tunnel: Tunnel, path: str
) -> None:
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await tunnel.http.ws_connect(
            tunnel.base + path,
            headers={"Authorization": f"Bearer {tunnel.token}"},
            protocols=["v5.channel.k8s.io"],
            ssl=client_context(tunnel.server.ca_pem),
        )
    assert refused.value.status == 403
    assert tunnel.upstream.requests == []


async def test_a_resource_named_like_a_self_review_is_not_one(tunnel: Tunnel) -> None:
    path = "/apis/evil.example.com/v1/namespaces/kube-system/selfsubjectreviews"
    status, body = await tunnel.call("POST", path, data=b'{"kind":"Anything"}')
    assert status == 403, body
    assert tunnel.upstream.requests == []


@pytest.mark.parametrize("path", ["/logs/kube-apiserver.log", "/metrics", "/debug/pprof/goroutine"])
async def test_the_api_servers_own_paths_are_outside_the_namespace_scope(
    tunnel: Tunnel, path: str
) -> None:
    status, body = await tunnel.call("GET", path)
    assert status == 403, body
    assert "serves namespaces team only" in body["message"]
    assert tunnel.upstream.requests == []


async def test_what_the_scope_and_read_only_allow_still_goes_through(tunnel: Tunnel) -> None:
    for method, path in [
        ("GET", "/api/v1/namespaces/team/pods"),
        ("GET", "/apis/apps/v1"),
        ("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"),
    ]:
        status, _ = await tunnel.call(method, path, data=b"{}" if method == "POST" else None)
        assert status == 200, (method, path)
    assert [request[:2] for request in tunnel.upstream.requests] == [
        ("GET", "/api/v1/namespaces/team/pods"),
        ("GET", "/apis/apps/v1"),
        ("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"),
    ]
