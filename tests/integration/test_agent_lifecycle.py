"""An agent's life against a real server on loopback: real TLS, real sockets."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import timedelta
from pathlib import Path

import aiohttp
import pytest

from protocol import Keepalive
from protocol.allowance import ALLOWANCE_START
from tunnel_agent.errors import AgentRejectedError, BootstrapRefusedError
from tunnel_server.config import IdentitySettings

from ..support import until
from .harness import (
    RunningServer,
    agent_settings,
    running_agent,
    running_server,
    server_settings,
)


async def test_fresh_agent_bootstraps_connects_and_is_listed(
    server: RunningServer, tmp_path: Path
) -> None:
    token = await server.add_cluster("prod-eu")
    settings = agent_settings(server, "prod-eu", token, tmp_path / "creds")
    async with running_agent(settings) as running:
        await running.wait_connected()
        assert running.agent.bootstraps == 1
        status, clusters = await server.api("GET", "/api/v1/clusters")
    assert status == 200
    [entry] = clusters
    assert entry["name"] == "prod-eu"
    assert entry["connected"] is True
    assert entry["agent_version"] == "0.1.0"
    assert entry["remote_addr"] == "127.0.0.1"
    assert entry["connected_since"] is not None
    assert entry["last_seen"] is not None
    key = tmp_path / "creds" / "tls.key"
    assert key.stat().st_mode & 0o777 == 0o600


async def test_restarted_agent_reuses_stored_credentials(
    server: RunningServer, tmp_path: Path
) -> None:
    token = await server.add_cluster("prod-eu")
    settings = agent_settings(server, "prod-eu", token, tmp_path / "creds")
    async with running_agent(settings) as first:
        await first.wait_connected()
    # The token is spent; a second bootstrap would be refused, so connecting
    # again proves the stored key and certificate were used.
    async with running_agent(settings) as second:
        await second.wait_connected()
        assert second.agent.bootstraps == 0
        assert second.agent.credentials is not None
        assert second.agent.credentials.serial == first.agent.credentials.serial  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("reused", "already used"),
        ("wrong", "unknown"),
        ("other-cluster", "another cluster"),
    ],
)
async def test_bad_bootstrap_token_is_refused_with_its_reason(
    server: RunningServer, tmp_path: Path, case: str, reason: str
) -> None:
    token = await server.add_cluster("prod-eu")
    other = await server.add_cluster("staging")
    if case == "reused":
        async with running_agent(agent_settings(server, "prod-eu", token, tmp_path / "a")) as a:
            await a.wait_connected()
    elif case == "wrong":
        token = "tbt_" + "x" * 43
    else:
        token = other
    settings = agent_settings(server, "prod-eu", token, tmp_path / "b")
    async with running_agent(settings) as running:
        with pytest.raises(BootstrapRefusedError, match=reason):
            await running.task


async def test_expired_bootstrap_token_is_refused(tmp_path: Path) -> None:
    settings = server_settings(
        tmp_path / "state", identity=IdentitySettings(bootstrap_token_ttl=timedelta(0))
    )
    async with running_server(settings) as server:
        token = await server.add_cluster("prod-eu")
        agent = agent_settings(server, "prod-eu", token, tmp_path / "creds")
        async with running_agent(agent) as running:
            with pytest.raises(BootstrapRefusedError, match="expired"):
                await running.task


async def test_revoked_cluster_is_disconnected_at_once_and_agent_stops(
    server: RunningServer, tmp_path: Path
) -> None:
    token = await server.add_cluster("prod-eu")
    async with running_agent(agent_settings(server, "prod-eu", token, tmp_path / "c")) as running:
        await running.wait_connected()
        status, answer = await server.api("POST", "/api/v1/clusters/prod-eu/revoke")
        assert status == 200
        assert answer == {"revoked_certificates": 1, "disconnected": True}
        assert server.context.registry.get("prod-eu") is None
        with pytest.raises(AgentRejectedError, match="revoked"):
            await running.task
    assert (await server.cluster("prod-eu"))["connected"] is False


async def test_second_agent_of_a_cluster_replaces_the_first(
    server: RunningServer, tmp_path: Path
) -> None:
    token = await server.add_cluster("prod-eu")
    settings = agent_settings(server, "prod-eu", token, tmp_path / "creds")
    async with running_agent(settings) as first:
        await first.wait_connected()
        first_session = first.agent.session
        assert first_session is not None
        async with running_agent(dataclasses.replace(settings, bootstrap_token=None)) as second:
            await second.wait_connected()
            # The old session was told to go away and ended.
            await first_session.wait_closed()
            assert first_session.connection.going_away
            current = server.context.registry.get("prod-eu")
            assert current is not None
            assert current.session is not first_session


async def test_agent_reconnects_after_server_restart(tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with running_server(server_settings(state)) as server:
        port = server.port
        token = await server.add_cluster("prod-eu")
        settings = agent_settings(server, "prod-eu", token, tmp_path / "creds")
        async with running_agent(settings) as running:
            await running.wait_connected()
            await server.stop()
            await until(lambda: not running.agent.connected.is_set())
            failures_before = running.agent.backoff.attempt
            # The agent keeps trying with growing delays while the server is away. Its
            # back-off timers run in real time (up to 0.5 s each here): turns are counted
            # generously, or a busy machine runs out of them before the third retry.
            await until(
                lambda: running.agent.backoff.attempt >= failures_before + 3, max_turns=10**7
            )
            async with running_server(server_settings(state, port=port)) as restarted:
                await running.wait_connected()
                assert running.agent.connections == 2
                assert running.agent.bootstraps == 1
                assert (await restarted.cluster("prod-eu"))["connected"] is True


async def test_certificate_is_renewed_over_the_live_socket(tmp_path: Path) -> None:
    # Certificates are back-dated five minutes for clock skew; a lifetime of
    # five minutes and two seconds puts half-life one second after issue.
    lifetime = timedelta(minutes=5, seconds=2)
    settings = server_settings(
        tmp_path / "state", identity=IdentitySettings(client_cert_lifetime=lifetime)
    )
    async with running_server(settings) as server:
        token = await server.add_cluster("prod-eu")
        agent = agent_settings(server, "prod-eu", token, tmp_path / "creds")
        async with running_agent(agent) as running:
            await running.wait_connected()
            first = running.agent.credentials
            assert first is not None
            await until(lambda: running.agent.renewals >= 1, max_turns=10**7)
            current = running.agent.credentials
            assert current is not None
            assert current.serial != first.serial
            assert current.not_after > first.not_after
            # Same connection throughout, and the new certificate is stored.
            assert running.agent.connections == 1
            stored = (tmp_path / "creds" / "tls.crt").read_bytes()
            assert stored == current.cert_pem


async def test_server_notices_a_silent_agent_within_the_keepalive_deadline(
    tmp_path: Path,
) -> None:
    keepalive = Keepalive(interval=0.2, timeout=0.3)
    settings = server_settings(tmp_path / "state")
    settings = dataclasses.replace(
        settings, tunnel=dataclasses.replace(settings.tunnel, keepalive=keepalive)
    )
    async with running_server(settings) as server:
        token = await server.add_cluster("prod-eu")
        agent = agent_settings(server, "prod-eu", token, tmp_path / "creds")
        async with running_agent(agent) as running:
            await running.wait_connected()
            # The agent knows it is connected once the server's HELLO came; the
            # server registers it just after: wait for that, not for luck.
            await until(lambda: server.context.registry.get("prod-eu") is not None)
            session = server.context.registry.get("prod-eu")
            assert session is not None
            # Freeze the agent: its reader stops, so it answers no PING.
            loop = asyncio.get_running_loop()
            for task in asyncio.all_tasks():
                if task.get_name() == "cluster=prod-eu reader":
                    task.cancel()
            started = loop.time()
            await session.session.wait_closed()
            elapsed = loop.time() - started
            assert "PING" in (session.session.close_reason or "")
            assert elapsed < keepalive.interval + keepalive.timeout + 1.0


async def test_expired_credentials_with_a_valid_token_bootstrap_again(
    server: RunningServer, tmp_path: Path
) -> None:
    from datetime import UTC, datetime

    from tunnel_agent.credentials import Credentials, DirectoryCredentialStore
    from tunnel_pki.ca import CertificateAuthority
    from tunnel_pki.csr import make_csr
    from tunnel_pki.keys import generate_private_key, private_key_to_pem

    token = await server.add_cluster("prod-eu")
    state = server.settings.state_dir
    ca = CertificateAuthority.load((state / "ca.crt").read_bytes(), (state / "ca.key").read_bytes())
    key = generate_private_key()
    long_ago = datetime(2020, 1, 1, tzinfo=UTC)
    expired = ca.sign_client_csr(make_csr(key, "prod-eu"), "prod-eu", timedelta(days=1), long_ago)
    store = DirectoryCredentialStore(tmp_path / "creds")
    await store.save(Credentials("prod-eu", private_key_to_pem(key), expired.cert_pem, ca.cert_pem))
    async with running_agent(agent_settings(server, "prod-eu", token, tmp_path / "creds")) as a:
        await a.wait_connected()
        assert a.agent.bootstraps == 1
        assert a.agent.credentials is not None
        assert a.agent.credentials.serial != expired.serial


async def test_graceful_shutdown_lets_an_open_request_finish_and_tells_agents_to_go(
    tmp_path: Path,
) -> None:
    from protocol import kinds
    from tunnel_agent.kubeproxy import KubeProxy
    from tunnel_agent.policy import ProxyPolicy
    from tunnel_agent.router import StreamRouter
    from tunnel_pki.tls import client_context

    from .test_kubeproxy_relay import agent_kube_api
    from .upstream import running_upstream

    settings = server_settings(tmp_path / "state")
    settings = dataclasses.replace(
        settings, tunnel=dataclasses.replace(settings.tunnel, shutdown_grace=10.0)
    )
    async with running_server(settings) as server, running_upstream() as upstream:
        token = await server.add_cluster("prod-eu")
        status, alice = await server.api("POST", "/api/v1/users", {"name": "alice"})
        assert status == 201
        await server.api("PUT", "/api/v1/grants/alice/prod-eu", {})
        api = agent_kube_api(upstream)
        router = StreamRouter()
        proxy = KubeProxy(api, ProxyPolicy())
        router.add(kinds.STREAM_HTTP, proxy.handle)
        agent_config = agent_settings(server, "prod-eu", token, tmp_path / "creds")
        async with running_agent(agent_config, on_stream=router) as running:
            await running.wait_connected()
            session = running.agent.session
            assert session is not None
            async with (
                aiohttp.ClientSession() as http,
                http.get(
                    f"{server.url}/k8s/clusters/prod-eu/api/v1/stream",
                    headers={"Authorization": f"Bearer {alice['token']}"},
                    ssl=client_context(server.ca_pem),
                ) as response,
            ):
                await upstream.stream_started.wait()
                stopping = asyncio.create_task(server.stop())
                # The agent is told to go away; the open request keeps going.
                await until(lambda: session.connection.going_away, max_turns=10**7)
                assert not stopping.done()
                await upstream.stream_lines.put(b"last line\n")
                await upstream.stream_lines.put(None)
                assert await response.content.read() == b"last line\n"
            await stopping
        await proxy.close()
        await api.close()


async def test_reinstall_after_revocation_trades_the_new_token_for_a_new_certificate(
    server: RunningServer, tmp_path: Path
) -> None:
    token = await server.add_cluster("prod-eu")
    settings = agent_settings(server, "prod-eu", token, tmp_path / "creds")
    async with running_agent(settings) as first:
        await first.wait_connected()
        old_serial = first.agent.credentials.serial  # type: ignore[union-attr]
        await server.api("POST", "/api/v1/clusters/prod-eu/revoke")
        with pytest.raises(AgentRejectedError):
            await first.task
    # The reinstall manifest brings a new token; the revoked certificate is still stored.
    status, answer = await server.api("POST", "/api/v1/clusters/prod-eu/token")
    assert status == 201
    renewed = dataclasses.replace(settings, bootstrap_token=answer["bootstrap_token"])
    async with running_agent(renewed) as second:
        await second.wait_connected()
        assert second.agent.bootstraps == 1
        assert second.agent.credentials is not None
        assert second.agent.credentials.serial != old_serial


async def test_a_new_bootstrap_token_supersedes_the_unused_old_one(
    server: RunningServer, tmp_path: Path
) -> None:
    old = await server.add_cluster("prod-eu")
    status, _ = await server.api("POST", "/api/v1/clusters/prod-eu/token")
    assert status == 201
    async with running_agent(agent_settings(server, "prod-eu", old, tmp_path / "c")) as agent:
        with pytest.raises(BootstrapRefusedError, match="expired"):
            await agent.task


async def test_revoked_api_tokens_stop_working_at_once(server: RunningServer) -> None:
    status, alice = await server.api("POST", "/api/v1/users", {"name": "alice"})
    assert status == 201
    assert (await server.api("GET", "/api/v1/whoami", token=alice["token"]))[0] == 200
    status, rotated = await server.api("POST", "/api/v1/users/alice/tokens?revoke_others=1")
    assert status == 201
    assert (await server.api("GET", "/api/v1/whoami", token=alice["token"]))[0] == 401
    assert (await server.api("GET", "/api/v1/whoami", token=rotated["token"]))[0] == 200
    status, answer = await server.api("DELETE", "/api/v1/users/alice/tokens")
    assert (status, answer["revoked"]) == (200, 1)
    assert (await server.api("GET", "/api/v1/whoami", token=rotated["token"]))[0] == 401


async def test_the_agent_does_not_cut_the_server_off_for_spending_past_its_allowance(
    server: RunningServer, tmp_path: Path
) -> None:
    # Thrice what the agent would allow a peer it did not trust: the server
    # enforces the allowance on agents, an agent only counts it.
    token = await server.add_cluster("prod-eu")
    async with running_agent(agent_settings(server, "prod-eu", token, tmp_path / "c")) as running:
        await running.wait_connected()
        # The server registers the agent just after the agent sees its HELLO.
        await until(lambda: server.context.registry.get("prod-eu") is not None)
        connection = server.context.registry.get("prod-eu")
        assert connection is not None
        session = connection.session
        for _ in range(30):  # a thousand at a time, each round answered before the next
            for _ in range(ALLOWANCE_START // 10):
                session.connection.send_ping(0.0)
            assert await asyncio.wait_for(session.ping(), 10.0) >= 0
        assert session.is_open
        assert running.agent.session is not None
        assert running.agent.session.is_open
