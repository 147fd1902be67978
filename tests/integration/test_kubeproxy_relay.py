"""The proxy's relay, end to end through server and agent, against a plain upstream."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client as kube_client
from yarl import URL

from protocol import kinds
from tunnel_agent.kubeapi import KubeApi
from tunnel_agent.kubeproxy import KubeProxy
from tunnel_agent.policy import ProxyPolicy
from tunnel_agent.router import StreamRouter
from tunnel_pki.tls import client_context

from ..support import until
from .harness import RunningAgent, RunningServer, agent_settings, running_agent
from .upstream import Upstream, running_upstream


@dataclass
class Tunnel:
    server: RunningServer
    agent: RunningAgent
    upstream: Upstream
    token: str
    http: aiohttp.ClientSession
    proxy: KubeProxy

    @property
    def base(self) -> str:
        return f"{self.server.url}/k8s/clusters/prod-eu"

    async def call(
        self, method: str, path: str, *, token: str | None = None, **kwargs: Any
    ) -> tuple[int, Any]:
        headers = kwargs.pop("headers", {})
        headers.setdefault("Authorization", f"Bearer {token or self.token}")
        async with self.http.request(
            method,
            self.base + path,
            headers=headers,
            ssl=client_context(self.server.ca_pem),
            **kwargs,
        ) as response:
            text = await response.text()
            try:
                return response.status, json.loads(text)
            except ValueError:
                return response.status, text


def agent_kube_api(upstream: Upstream) -> KubeApi:
    configuration = kube_client.Configuration(host=upstream.url)
    configuration.api_key["BearerToken"] = "Bearer agent-service-account-token"
    return KubeApi(configuration)


@contextlib.asynccontextmanager
async def running_tunnel(
    server: RunningServer,
    tmp_path: Path,
    policy: ProxyPolicy,
    user: dict[str, Any],
    grant: dict[str, Any],
) -> AsyncIterator[Tunnel]:
    """Cluster prod-eu behind an agent with ``policy``, and ``user`` granted it."""
    bootstrap = await server.add_cluster("prod-eu")
    status, answer = await server.api("POST", "/api/v1/users", user)
    assert status == 201, answer
    status, _ = await server.api("PUT", f"/api/v1/grants/{user['name']}/prod-eu", grant)
    assert status == 200
    async with running_upstream() as upstream:
        api = agent_kube_api(upstream)
        proxy = KubeProxy(api, policy)
        router = StreamRouter()
        router.add(kinds.STREAM_HTTP, proxy.handle)
        settings = agent_settings(server, "prod-eu", bootstrap, tmp_path / "creds")
        async with running_agent(settings, on_stream=router) as agent:
            await agent.wait_connected()
            async with aiohttp.ClientSession() as http:
                yield Tunnel(server, agent, upstream, answer["token"], http, proxy)
        await proxy.close()
        await proxy.api.close()
        await api.close()


@pytest.fixture
async def tunnel(server: RunningServer, tmp_path: Path) -> AsyncIterator[Tunnel]:
    user = {"name": "alice", "groups": ["platform"]}
    async with running_tunnel(
        server, tmp_path, ProxyPolicy(), user, {"as_groups": ["viewers"]}
    ) as running:
        yield running


async def test_request_is_relayed_with_impersonation_and_without_caller_credentials(
    tunnel: Tunnel,
) -> None:
    status, body = await tunnel.call(
        "POST", "/api/v1/namespaces/default/configmaps?dryRun=All", data=b"payload"
    )
    assert status == 200
    assert body == {
        "method": "POST",
        "path": "/api/v1/namespaces/default/configmaps?dryRun=All",
        "body": "payload",
    }
    _, _, headers = tunnel.upstream.requests[-1]
    assert headers["Authorization"] == "Bearer agent-service-account-token"
    assert tunnel.token not in str(dict(headers))
    assert headers["Impersonate-User"] == "tunnel:alice"
    assert headers.getall("Impersonate-Group") == ["tunnel:platform", "tunnel:viewers"]


async def test_error_status_and_body_pass_through_unchanged(tunnel: Tunnel) -> None:
    status, body = await tunnel.call("GET", "/api/v1/missing")
    assert status == 404
    assert body == {"kind": "Status", "reason": "NotFound", "code": 404}


async def test_streamed_response_arrives_chunk_by_chunk(tunnel: Tunnel) -> None:
    async with tunnel.http.get(
        tunnel.base + "/api/v1/stream",
        headers={"Authorization": f"Bearer {tunnel.token}"},
        ssl=client_context(tunnel.server.ca_pem),
    ) as response:
        assert response.status == 200
        await tunnel.upstream.stream_started.wait()
        for number in range(3):
            line = json.dumps({"type": "ADDED", "n": number}).encode() + b"\n"
            await tunnel.upstream.stream_lines.put(line)
            # Each event arrives before the next is produced: nothing buffers whole bodies.
            assert await response.content.readline() == line
        await tunnel.upstream.stream_lines.put(None)
        assert await response.content.read() == b""


@pytest.mark.parametrize(
    ("token", "status", "reason"),
    [("tat_wrong", 401, "Unauthorized"), ("", 401, "Unauthorized")],
)
async def test_bad_token_gets_401_status(
    tunnel: Tunnel, token: str, status: int, reason: str
) -> None:
    headers = {"Authorization": f"Bearer {token}"} if token else {"Authorization": ""}
    got, body = await tunnel.call("GET", "/api/v1/pods", headers=headers)
    assert got == status
    assert body["kind"] == "Status"
    assert body["reason"] == reason
    assert tunnel.upstream.requests == []


async def test_user_without_grant_gets_403(tunnel: Tunnel) -> None:
    status, answer = await tunnel.server.api("POST", "/api/v1/users", {"name": "bob"})
    assert status == 201
    got, body = await tunnel.call("GET", "/api/v1/pods", token=answer["token"])
    assert got == 403
    assert "no grant" in body["message"]
    assert tunnel.upstream.requests == []


async def test_caller_impersonation_is_refused_without_grant(tunnel: Tunnel) -> None:
    got, body = await tunnel.call(
        "GET", "/api/v1/pods", headers={"Impersonate-User": "system:admin"}
    )
    assert got == 403
    assert "impersonate" in body["message"]
    assert tunnel.upstream.requests == []


@pytest.mark.parametrize(
    "path",
    [
        "/../staging/api/v1/pods",
        "/api/v1/%2e%2e/x",
        "/api/v1/namespaces%2fkube-system/pods",
        "/api//v1/pods",
        "/api/v1/..%2Fsecrets",
    ],
)
async def test_paths_that_try_to_escape_are_refused(tunnel: Tunnel, path: str) -> None:
    url = URL(tunnel.base + path, encoded=True)
    async with tunnel.http.get(
        url,
        headers={"Authorization": f"Bearer {tunnel.token}"},
        ssl=client_context(tunnel.server.ca_pem),
    ) as response:
        assert response.status in (400, 403, 404)
    assert all("staging" not in path for _, path, _ in tunnel.upstream.requests)
    assert tunnel.upstream.requests == []


async def test_other_clusters_name_in_path_cannot_reach_it(tunnel: Tunnel) -> None:
    await tunnel.server.add_cluster("staging")
    got, _ = await tunnel.call("GET", "/../../staging/api/v1/pods")
    assert got in (400, 404)
    # alice has no grant on staging: asking for it directly is refused.
    async with tunnel.http.get(
        f"{tunnel.server.url}/k8s/clusters/staging/api/v1/pods",
        headers={"Authorization": f"Bearer {tunnel.token}"},
        ssl=client_context(tunnel.server.ca_pem),
    ) as response:
        assert response.status == 403


async def test_disconnected_cluster_fails_fast_with_503(tunnel: Tunnel) -> None:
    await tunnel.agent.stop()
    loop = asyncio.get_running_loop()
    started = loop.time()
    got, body = await tunnel.call("GET", "/api/v1/pods")
    assert got == 503
    assert body["reason"] == "ServiceUnavailable"
    assert "not connected" in body["message"]
    assert loop.time() - started < 1.0


async def test_an_agent_that_just_left_is_answered_503_with_a_retry(tunnel: Tunnel) -> None:
    await tunnel.agent.stop()
    async with tunnel.http.get(
        tunnel.base + "/api/v1/pods",
        headers={"Authorization": f"Bearer {tunnel.token}"},
        ssl=client_context(tunnel.server.ca_pem),
    ) as response:
        body = await response.json()
    assert response.status == 503
    # A restart or a reconnect: kubectl's retries a second apart may see it back.
    assert response.headers["Retry-After"] == "1"
    assert body["message"] == (
        "cluster prod-eu is not connected (its agent left 0s ago and is expected back shortly)"
    )


async def lose_the_agent_mid_stream(tunnel: Tunnel) -> None:
    """Stop the agent once a streamed answer has begun; the caller's read must fail."""
    async with tunnel.http.get(
        tunnel.base + "/api/v1/stream",
        headers={"Authorization": f"Bearer {tunnel.token}"},
        ssl=client_context(tunnel.server.ca_pem),
    ) as response:
        await tunnel.upstream.stream_started.wait()
        await tunnel.upstream.stream_lines.put(b'{"type":"ADDED"}\n')
        assert await response.content.readline() == b'{"type":"ADDED"}\n'
        await tunnel.agent.stop()
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.content.read()


async def test_agent_loss_mid_stream_ends_the_response_with_an_error(tunnel: Tunnel) -> None:
    await lose_the_agent_mid_stream(tunnel)


async def test_websocket_upgrade_is_relayed_both_ways(tunnel: Tunnel) -> None:
    async with tunnel.http.ws_connect(
        tunnel.base + "/api/v1/namespaces/default/pods/p/exec?command=cat",
        headers={"Authorization": f"Bearer {tunnel.token}"},
        protocols=["v5.channel.k8s.io"],
        ssl=client_context(tunnel.server.ca_pem),
    ) as ws:
        assert ws.protocol == "v5.channel.k8s.io"
        for payload in (b"\x00hello", b"\x00" + b"x" * 200_000):
            await ws.send_bytes(payload)
            message = await ws.receive()
            assert message.data == b"echo:" + payload
    _, _, headers = tunnel.upstream.requests[-1]
    assert headers["Impersonate-User"] == "tunnel:alice"


async def test_each_request_is_audited(tunnel: Tunnel) -> None:
    await tunnel.call("GET", "/api/v1/namespaces/default/pods/p")
    await tunnel.call("GET", "/api/v1/namespaces/default/pods/missing")
    status, events = await tunnel.server.api("GET", "/api/v1/audit?kind=proxy&user=alice")
    assert status == 200
    assert [(e["verb"], e["path"], e["status"]) for e in events[:2]] == [
        ("get", "/api/v1/namespaces/default/pods/missing", 404),
        ("get", "/api/v1/namespaces/default/pods/p", 200),
    ]
    assert all(e["cluster"] == "prod-eu" and e["bytes_out"] > 0 for e in events[:2])


async def audited(tunnel: Tunnel) -> list[dict[str, Any]]:
    """alice's proxied requests in the audit trail, newest first, once none is in progress."""
    live = tunnel.server.context.live
    await until(lambda: not any(live.requests()), max_turns=10**7)
    status, events = await tunnel.server.api("GET", "/api/v1/audit?kind=proxy&user=alice")
    assert status == 200
    return list(events)


def how_it_ended(event: dict[str, Any]) -> dict[str, Any]:
    """An audit event's detail but the identity sent (test_impersonation_record.py)."""
    return {key: value for key, value in event["detail"].items() if key != "as"}


async def test_a_request_answered_in_full_has_no_ending_in_the_audit(tunnel: Tunnel) -> None:
    got, _ = await tunnel.call("GET", "/api/v1/namespaces/default/pods/missing")
    assert got == 404  # the API server's answer, however it reads, is an answer
    [event] = await audited(tunnel)
    assert (event["status"], how_it_ended(event)) == (404, {})
    assert event["detail"]["as"]["user"] == "tunnel:alice"


async def test_the_audit_says_why_a_request_was_refused(tunnel: Tunnel) -> None:
    got, body = await tunnel.call(
        "GET", "/api/v1/pods", headers={"Impersonate-User": "system:admin"}
    )
    assert got == 403
    [event] = await audited(tunnel)
    assert (event["status"], how_it_ended(event)) == (403, {"ended": body["message"]})


async def test_the_audit_says_the_agent_cut_an_answer_short(tunnel: Tunnel) -> None:
    await lose_the_agent_mid_stream(tunnel)
    [event] = await audited(tunnel)
    assert event["status"] == 200  # what the caller was answered before the cut
    assert how_it_ended(event) == {
        "ended": "the session with the cluster's agent ended: "
        "the peer closed the connection (CANCEL)"
    }


async def leave_a_watch(tunnel: Tunnel) -> None:
    """Open a streamed answer, read its first line, and go away."""
    async with aiohttp.ClientSession() as http:
        response = await http.get(
            tunnel.base + "/api/v1/stream",
            headers={"Authorization": f"Bearer {tunnel.token}"},
            ssl=client_context(tunnel.server.ca_pem),
        )
        await tunnel.upstream.stream_started.wait()
        await tunnel.upstream.stream_lines.put(b"first\n")
        assert await response.content.readline() == b"first\n"
        response.close()


async def test_the_audit_says_the_caller_left(tunnel: Tunnel) -> None:
    await leave_a_watch(tunnel)
    [event] = await audited(tunnel)
    assert (event["status"], how_it_ended(event)) == (200, {"ended": "the caller left"})


async def test_non_websocket_upgrade_is_relayed_byte_for_byte(tunnel: Tunnel) -> None:
    """A SPDY/3.1 upgrade (kubectl's older exec and port-forward) passes unchanged.

    Over TLS a caller cannot half-close the socket itself; half-close lives in
    the upgraded protocol (SPDY FIN, the v5 close-stdin channel), which the
    relay carries as bytes. Closing the connection ends the upstream's side.
    """
    port = int(tunnel.server.url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=client_context(tunnel.server.ca_pem), server_hostname="127.0.0.1"
    )
    writer.write(
        b"POST /k8s/clusters/prod-eu/api/v1/namespaces/default/pods/p/exec HTTP/1.1\r\n"
        b"Host: tunnel\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"
        + f"Authorization: Bearer {tunnel.token}\r\n\r\n".encode()
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 101")
    assert b"upgrade: SPDY/3.1" in head.lower().replace(b"spdy", b"SPDY")
    for payload in (b"\x80\x03\x00\x01frame-one", bytes(range(256)) * 400):
        writer.write(payload)
        await writer.drain()
        expected = b"echo:" + payload
        received = b""
        while len(received) < len(expected):
            chunk = await asyncio.wait_for(reader.read(65536), 10)
            assert chunk, "the relay ended early"
            received += chunk
        assert received == expected
    writer.close()
    await asyncio.wait_for(tunnel.upstream.raw_ended.wait(), 10)
    _, _, headers = tunnel.upstream.requests[-1]
    assert headers["Upgrade"] == "SPDY/3.1"
    assert headers["Impersonate-User"] == "tunnel:alice"


async def test_a_caller_that_leaves_a_watch_closes_it_upstream_at_once(tunnel: Tunnel) -> None:
    """No waiting for the watch's next event: the relay is torn down end to end."""
    await leave_a_watch(tunnel)  # the upstream stays quiet meanwhile
    agent_session = tunnel.agent.agent.session
    assert agent_session is not None
    await until(lambda: agent_session.streams == 0, max_turns=10**7)
    [upstream_connection] = tunnel.upstream.stream_transports
    await until(upstream_connection.is_closing, max_turns=10**7)


async def test_request_body_without_length_is_relayed_intact(tunnel: Tunnel) -> None:
    """A caller's chunked body reaches the API server whole (the agent sends it chunked)."""
    parts = [b"first,", b"second," * 20_000, b"third"]

    async def chunks() -> AsyncIterator[bytes]:
        for part in parts:
            yield part

    status, body = await tunnel.call("POST", "/api/v1/namespaces/default/configmaps", data=chunks())
    assert status == 200
    assert body["body"] == b"".join(parts).decode()
    _, _, headers = tunnel.upstream.requests[-1]
    assert headers["Transfer-Encoding"] == "chunked"


async def test_large_request_body_with_length_is_relayed_intact(tunnel: Tunnel) -> None:
    payload = bytes(range(32, 127)) * 10_000  # 950 kB: under the upstream's 1 MiB limit
    status, body = await tunnel.call(
        "PUT", "/api/v1/namespaces/default/configmaps/c", data=io.BytesIO(payload)
    )
    assert status == 200
    assert body["body"] == payload.decode()
    _, _, headers = tunnel.upstream.requests[-1]
    assert headers["Content-Length"] == str(len(payload))


async def test_head_request_is_answered_with_the_head_only(tunnel: Tunnel) -> None:
    async with tunnel.http.head(
        tunnel.base + "/api/v1/namespaces/default/pods/p",
        headers={"Authorization": f"Bearer {tunnel.token}"},
        ssl=client_context(tunnel.server.ca_pem),
    ) as response:
        assert response.status == 200
        assert response.headers["X-Upstream"] == "yes"
        assert await response.read() == b""
    assert tunnel.upstream.requests[-1][:2] == ("HEAD", "/api/v1/namespaces/default/pods/p")


async def test_unreachable_api_server_answers_502_with_a_status(tunnel: Tunnel) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    configuration = kube_client.Configuration(host=f"http://127.0.0.1:{closed_port}")
    await tunnel.proxy.close()  # its next request connects anew, to the new address
    tunnel.proxy.api = KubeApi(configuration)
    status, body = await tunnel.call("GET", "/api/v1/pods")
    assert status == 502
    assert body["kind"] == "Status"
    assert body["reason"] == "BadGateway"
    assert (
        f"cannot reach the API server: cannot connect to the API server at http://127.0.0.1:{closed_port}"
        in body["message"]
    )


async def test_an_answer_the_api_server_breaks_off_breaks_the_callers_response(
    tunnel: Tunnel,
) -> None:
    async with tunnel.http.get(
        tunnel.base + "/api/v1/stream",
        headers={"Authorization": f"Bearer {tunnel.token}"},
        ssl=client_context(tunnel.server.ca_pem),
    ) as response:
        await tunnel.upstream.stream_started.wait()
        await tunnel.upstream.stream_lines.put(b'{"type":"ADDED"}\n')
        assert await response.content.readline() == b'{"type":"ADDED"}\n'
        # The API server's connection drops mid-answer, without the last chunk.
        [upstream_connection] = tunnel.upstream.stream_transports
        assert isinstance(upstream_connection, asyncio.Transport)
        upstream_connection.abort()
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.content.read()


async def test_an_early_answer_to_a_body_still_coming_is_relayed(tunnel: Tunnel) -> None:
    """The upstream refuses a body over 1 MiB before reading it all: its 413 comes through."""
    payload = b"x" * (4 * 1024 * 1024)
    status, body = await tunnel.call(
        "PUT", "/api/v1/namespaces/default/configmaps/c", data=io.BytesIO(payload)
    )
    assert status == 413
    assert "Maximum request body size" in str(body)
