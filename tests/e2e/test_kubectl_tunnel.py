"""The real kubectl through the tunnel, against the Kubernetes API stand-in.

kubectl -> tunnel server (TLS, alice's token) -> one WebSocket -> agent ->
stand-in API server (the agent's own token, impersonating tunnel:alice).
"""

from __future__ import annotations

import asyncio
import re
import statistics
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from protocol import kinds
from tests.kubestub import KubeStub
from tests.kubestub_tests.kubectl import TIMEOUT, Kubectl
from tunnel_agent.kubeapi import KubeApi, load_kube_configuration
from tunnel_agent.kubeproxy import KubeProxy
from tunnel_agent.policy import ProxyPolicy
from tunnel_agent.router import StreamRouter
from tunnel_pki.tls import client_context

from ..integration.harness import (
    RunningAgent,
    RunningServer,
    agent_settings,
    running_agent,
    running_server,
    server_settings,
)
from ..support import until


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[RunningServer]:
    async with running_server(server_settings(tmp_path / "state")) as running:
        yield running


@dataclass
class Tunnel:
    stub: KubeStub
    server: RunningServer
    agent: RunningAgent
    kubectl: Kubectl
    alice_token: str
    settings_dir: Path

    @property
    def url(self) -> str:
        return f"{self.server.url}/k8s/clusters/prod-eu"


def registered(server: RunningServer, cluster: str) -> bool:
    """The server has the cluster's agent, on a session still open."""
    connection = server.context.registry.get(cluster)
    return connection is not None and connection.session.is_open


@pytest.fixture
async def tunnel(server: RunningServer, tmp_path: Path) -> AsyncIterator[Tunnel]:
    async with KubeStub() as stub:
        stub.add_pod("demo")
        bootstrap = await server.add_cluster("prod-eu")
        status, _ = await server.api(
            "POST", "/api/v1/users", {"name": "alice", "groups": ["platform"]}
        )
        assert status == 201
        await server.api("PUT", "/api/v1/grants/alice/prod-eu", {})
        status, answer = await server.api("POST", "/api/v1/users/alice/kubeconfig?cluster=prod-eu")
        assert status == 201
        # The test server's public URL names no real port; point kubectl at it.
        kubeconfig = tmp_path / "kc.yaml"
        kubeconfig.write_text(answer["kubeconfig"].replace("https://127.0.0.1:1", server.url))
        home = tmp_path / "home"
        home.mkdir()
        api = KubeApi(await load_kube_configuration(stub.write_kubeconfig(tmp_path / "agent.kc")))
        router = StreamRouter()
        proxy = KubeProxy(api, ProxyPolicy())
        router.add(kinds.STREAM_HTTP, proxy.handle)
        settings = agent_settings(server, "prod-eu", bootstrap, tmp_path / "creds")
        try:
            async with running_agent(settings, on_stream=router) as agent:
                await agent.wait_connected()
                # The server registers the agent just after the agent sees its HELLO.
                await until(lambda: registered(server, "prod-eu"))
                yield Tunnel(
                    stub,
                    server,
                    agent,
                    Kubectl(kubeconfig, home, tmp_path),
                    answer["kubeconfig"].split("token: ")[1].split()[0],
                    tmp_path,
                )
        finally:
            await proxy.close()
            await api.close()


async def test_get_pods_prints_the_servers_table(tunnel: Tunnel) -> None:
    result = await tunnel.kubectl.run("get", "pods", "-A")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    header, row = result.stdout.splitlines()[:2]
    assert header.split() == ["NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert row.split()[:2] == ["default", "demo"]


async def test_identity_is_impersonated_and_callers_token_never_reaches_the_cluster(
    tunnel: Tunnel,
) -> None:
    result = await tunnel.kubectl.run("get", "pod", "demo", "-o", "name")
    assert result.stdout.strip() == "pod/demo"
    entries = [e for e in tunnel.stub.requests if e.path.endswith("/pods/demo")]
    assert entries
    for entry in entries:
        assert entry.header("Impersonate-User") == "tunnel:alice"
        assert entry.header_values("Impersonate-Group") == ["tunnel:platform"]
        assert entry.header("Authorization") == f"Bearer {tunnel.stub.token}"
    assert all(tunnel.alice_token not in str(e.headers) for e in tunnel.stub.requests)


async def test_watch_streams_events_as_they_happen(tunnel: Tunnel) -> None:
    watch = await tunnel.kubectl.start("get", "pods", "-w", "--no-headers")
    try:
        assert (await watch.line()).split()[0] == "demo"
        tunnel.stub.add_pod("arrived-later")
        assert (await watch.line()).split()[0] == "arrived-later"
    finally:
        await watch.stop()


async def test_logs_follow_streams_lines_as_they_are_written(tunnel: Tunnel) -> None:
    logs = await tunnel.kubectl.start("logs", "-f", "demo")
    try:
        for number in range(3):
            tunnel.stub.append_log("default", "demo", f"line {number}")
            assert await logs.line() == f"line {number}"
    finally:
        await logs.stop()


async def test_apply_creates_then_patches_and_delete_removes(tunnel: Tunnel) -> None:
    manifest = """apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: default}
data: {colour: %s}
"""
    tunnel.kubectl.write("cm.yaml", manifest % "blue")
    created = await tunnel.kubectl.run("apply", "-f", "cm.yaml")
    assert created.stdout.strip() == "configmap/settings created", created.stderr
    tunnel.kubectl.write("cm.yaml", manifest % "green")
    patched = await tunnel.kubectl.run("apply", "-f", "cm.yaml")
    assert patched.stdout.strip() == "configmap/settings configured", patched.stderr
    stored = tunnel.stub.get("v1", "ConfigMap", "settings", "default")
    assert stored is not None
    assert stored["data"] == {"colour": "green"}
    deleted = await tunnel.kubectl.run("delete", "configmap", "settings")
    assert deleted.stdout.strip() == 'configmap "settings" deleted'
    assert tunnel.stub.get("v1", "ConfigMap", "settings", "default") is None


async def test_exec_carries_stdin_stdout_stderr_and_exit_status(tunnel: Tunnel) -> None:
    echo = await tunnel.kubectl.run("exec", "demo", "--", "echo", "hi")
    assert (echo.returncode, echo.stdout) == (0, "hi\n")
    data = "".join(f"line {n}\n" for n in range(2000))
    cat = await tunnel.kubectl.run("exec", "-i", "demo", "--", "cat", stdin=data.encode())
    assert (cat.returncode, cat.stdout) == (0, data)  # stdin's end reached cat: half-close
    both = await tunnel.kubectl.run("exec", "demo", "--", "sh", "-c", "echo out; echo err >&2")
    assert (both.stdout, both.stderr) == ("out\n", "err\n")
    failing = await tunnel.kubectl.run("exec", "demo", "--", "sh", "-c", "exit 3")
    assert failing.returncode == 3
    upgrade = next(e for e in tunnel.stub.requests if "/exec" in e.path)
    assert upgrade.status == 101


async def port_forward_echoes(kubectl: Kubectl, payload: bytes) -> str:
    """``kubectl port-forward pod/demo`` carries ``payload`` to the stand-in's echo and back
    (half-closed, as the stand-in's pods echo until EOF); what kubectl wrote on stderr."""
    forwarding = await kubectl.start("port-forward", "pod/demo", ":8080")
    try:
        match = re.match(r"Forwarding from 127\.0\.0\.1:(\d+) -> 8080", await forwarding.line())
        assert match, "kubectl did not say where it listens"
        reader, writer = await asyncio.open_connection("127.0.0.1", int(match.group(1)))
        writer.write(payload)
        writer.write_eof()
        echoed = await asyncio.wait_for(reader.read(), TIMEOUT)
        writer.close()
        await writer.wait_closed()
        assert echoed == payload
    finally:
        stderr = await forwarding.stop()
    return stderr


async def test_port_forward_carries_real_bytes(tunnel: Tunnel) -> None:
    assert await port_forward_echoes(tunnel.kubectl, bytes(range(256)) * 1000) == ""


async def test_cp_copies_into_a_pod_and_back(tunnel: Tunnel) -> None:
    source = tunnel.kubectl.workdir / "src"
    source.mkdir()
    (source / "a.txt").write_text("hello\n")
    upload = await tunnel.kubectl.run("cp", "src", "demo:/tmp/up")
    assert (upload.returncode, upload.stderr) == (0, "")
    assert tunnel.stub.pod_files("default", "demo").read("/tmp/up/a.txt") == b"hello\n"
    download = await tunnel.kubectl.run("cp", "demo:/tmp/up", "back")
    assert (download.returncode, download.stderr) == (0, "")
    assert (tunnel.kubectl.workdir / "back" / "a.txt").read_text() == "hello\n"


async def test_auth_can_i_answers_for_the_impersonated_user(tunnel: Tunnel) -> None:
    allowed = await tunnel.kubectl.run("auth", "can-i", "delete", "pods")
    assert allowed.stdout.strip() == "yes"
    tunnel.stub.deny("tunnel:alice", "delete", "pods", namespace="*", api_group="*", name="*")
    refused = await tunnel.kubectl.run("auth", "can-i", "delete", "pods")
    assert refused.stdout.strip() == "no"


async def test_error_statuses_pass_through_unchanged(tunnel: Tunnel) -> None:
    missing = await tunnel.kubectl.run("get", "pod", "nope")
    assert missing.returncode == 1
    assert 'Error from server (NotFound): pods "nope" not found' in missing.stderr
    again = await tunnel.kubectl.run("create", "configmap", "twice")
    assert again.returncode == 0
    conflict = await tunnel.kubectl.run("create", "configmap", "twice")
    assert conflict.returncode == 1
    assert 'configmaps "twice" already exists' in conflict.stderr
    assert [e.status for e in tunnel.stub.requests if e.method == "POST"][-1] == 409
    tunnel.stub.deny("tunnel:alice", "delete", "pods", namespace="*", api_group="*", name="*")
    forbidden = await tunnel.kubectl.run("delete", "pod", "demo")
    assert "Error from server (Forbidden)" in forbidden.stderr
    assert "tunnel:alice" in forbidden.stderr


async def test_a_stalled_log_follower_does_not_slow_other_requests(tunnel: Tunnel) -> None:
    """One reader stops reading its logs -f; everything else keeps its pace."""
    ssl = client_context(tunnel.server.ca_pem)
    headers = {"Authorization": f"Bearer {tunnel.alice_token}"}
    pods = f"{tunnel.url}/api/v1/namespaces/default/pods/demo"

    async def latencies(http: aiohttp.ClientSession, count: int) -> list[float]:
        found = []
        for _ in range(count):
            started = time.perf_counter()
            async with http.get(pods, headers=headers, ssl=ssl) as response:
                assert response.status == 200
                await response.read()
            found.append(time.perf_counter() - started)
        return found

    async with aiohttp.ClientSession() as http:
        baseline = await latencies(http, 30)
        stalled = await http.get(
            f"{pods}/log?follow=true", headers=headers, ssl=ssl, read_bufsize=2**16
        )
        try:
            # Write far more than the stream's window and every socket buffer
            # on the way (loopback buffers autotune to several MB) while
            # nobody reads: 32 MB.
            line = "x" * 8000
            for _ in range(4000):
                tunnel.stub.append_log("default", "demo", line)
            session = tunnel.server.context.registry.get("prod-eu")
            assert session is not None
            stream_id = max(session.session.connection.stream_ids())
            agent_session = tunnel.agent.agent.session
            assert agent_session is not None
            # The stalled stream's producer is out of credit: the agent cannot send on it.
            await until(
                lambda: agent_session.connection.send_window(stream_id) == 0, max_turns=10**7
            )
            during = await latencies(http, 30)
        finally:
            stalled.close()
    # Every request completed while the stream stayed stalled: no head-of-line
    # blocking (which would hold them until the stalled reader read). The bound
    # only catches that; speed itself is measured in bench/bench_proxy.py.
    assert statistics.median(during) < max(20 * statistics.median(baseline), 1.0)


async def test_agent_loss_ends_an_exec_session_saying_why(tunnel: Tunnel) -> None:
    session = await tunnel.kubectl.start("exec", "-i", "demo", "--", "cat", stdin=True)
    assert session.process.stdin is not None
    session.process.stdin.write(b"still here\n")
    assert await session.line() == "still here"  # the session is open end to end
    agent_session = tunnel.agent.agent.session
    assert agent_session is not None
    await agent_session.close()  # the agent's socket drops; it will reconnect
    code = await asyncio.wait_for(session.process.wait(), TIMEOUT)
    stderr = await session.stop()
    assert code != 0
    assert "close 1001 (going away): the session with the cluster's agent ended" in stderr


async def test_agent_loss_ends_a_watch_promptly_and_requests_work_after_it_returns(
    tunnel: Tunnel,
) -> None:
    watch = await tunnel.kubectl.start("get", "pods", "-w", "--no-headers")
    assert (await watch.line()).split()[0] == "demo"
    # The first line comes from kubectl's LIST; its WATCH follows. Drop the
    # agent only once the watch is open upstream: a WATCH sent after the agent
    # is back would go through the new session and never break.
    await until(lambda: tunnel.stub.store.watcher_count >= 1, max_turns=10**7)
    session = tunnel.agent.agent.session
    assert session is not None
    started = time.monotonic()
    await session.close()  # the agent's socket drops; it will reconnect
    code = await asyncio.wait_for(watch.process.wait(), TIMEOUT)
    ended_after = time.monotonic() - started
    await watch.stop()
    assert code != 0  # kubectl saw the watch break (it retries from resourceVersion)
    assert ended_after < 5.0
    await until(lambda: tunnel.agent.agent.connections >= 2, max_turns=10**7)
    await tunnel.agent.wait_connected()
    await until(lambda: registered(tunnel.server, "prod-eu"))
    again = await tunnel.kubectl.run("get", "pod", "demo", "-o", "name")
    assert again.stdout.strip() == "pod/demo", again.stderr
