"""The agent socket refuses what it must, with a reason an agent can act on.

Hand-made client certificates against a real server on loopback (real TLS),
spoken to with aiohttp directly, and one real agent facing a busy server.
"""

from __future__ import annotations

import dataclasses
import logging
import ssl
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from protocol import kinds
from tunnel_agent.backoff import Backoff
from tunnel_agent.errors import ConnectError
from tunnel_pki.ca import CertificateAuthority, IssuedCertificate
from tunnel_pki.csr import make_csr
from tunnel_pki.keys import generate_private_key, private_key_to_pem
from tunnel_pki.tls import client_context
from tunnel_server.config import ServerSettings

from ..support import until
from .harness import (
    RunningServer,
    agent_settings,
    running_agent,
    running_server,
    server_settings,
)


@dataclass(frozen=True)
class ClientCertificate:
    issued: IssuedCertificate
    key_pem: bytes


def server_ca(server: RunningServer) -> CertificateAuthority:
    """The server's own CA, loaded from its state directory."""
    state = server.settings.state_dir
    return CertificateAuthority.load(
        (state / "ca.crt").read_bytes(), (state / "ca.key").read_bytes()
    )


def client_certificate(
    ca: CertificateAuthority,
    cluster: str,
    *,
    now: datetime | None = None,
    lifetime: timedelta = timedelta(hours=1),
) -> ClientCertificate:
    """An agent certificate for ``cluster`` signed by ``ca`` (as of ``now``)."""
    key = generate_private_key()
    issued = ca.sign_client_csr(make_csr(key, cluster), cluster, lifetime, now or datetime.now(UTC))
    return ClientCertificate(issued, private_key_to_pem(key))


def tls_for(server: RunningServer, certificate: ClientCertificate | None) -> ssl.SSLContext:
    """A client context pinning the server's CA, presenting ``certificate`` if any."""
    if certificate is None:
        return client_context(server.ca_pem)
    return client_context(
        server.ca_pem, cert_pem=certificate.issued.cert_pem, key_pem=certificate.key_pem
    )


def agent_socket_url(server: RunningServer) -> str:
    return server.url + kinds.PATH_AGENT_CONNECT


async def refusal(
    server: RunningServer, certificate: ClientCertificate | None
) -> tuple[int, dict[str, Any]]:
    """Try the WebSocket upgrade (it must be refused), then GET the reason's JSON body."""
    context = tls_for(server, certificate)
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(agent_socket_url(server), ssl=context)
        async with http.get(agent_socket_url(server), ssl=context) as response:
            assert response.status == refused.value.status
            body = await response.json()
    return refused.value.status, body["error"]


@pytest.mark.parametrize("case", ["another CA", "expired"])
async def test_certificate_that_does_not_verify_is_refused_during_tls(
    server: RunningServer, case: str
) -> None:
    await server.add_cluster("prod-eu")
    if case == "another CA":
        certificate = client_certificate(CertificateAuthority.create(), "prod-eu")
    else:
        # Issued two days ago for one hour: it expired the day before yesterday.
        past = datetime.now(UTC) - timedelta(days=2)
        certificate = client_certificate(server_ca(server), "prod-eu", now=past)
        assert certificate.issued.not_after < datetime.now(UTC)
    context = tls_for(server, certificate)
    async with aiohttp.ClientSession() as http:
        # No HTTP answer at all: the TLS layer drops the connection.
        with pytest.raises(aiohttp.ClientConnectionError):
            await http.ws_connect(agent_socket_url(server), ssl=context)
        with pytest.raises(aiohttp.ClientConnectionError):
            await http.get(agent_socket_url(server), ssl=context)
        # The same request with a certificate that verifies gets through TLS to HTTP.
        good = tls_for(server, client_certificate(server_ca(server), "prod-eu"))
        async with http.get(agent_socket_url(server), ssl=good) as response:
            assert response.status == 400  # a GET that is not a WebSocket upgrade


async def test_revoked_certificate_is_refused_with_certificate_revoked(
    server: RunningServer,
) -> None:
    await server.add_cluster("prod-eu")
    certificate = client_certificate(server_ca(server), "prod-eu")
    issued = certificate.issued
    await server.context.store.record_certificate(
        issued.serial, "prod-eu", issued.fingerprint, issued.not_before, issued.not_after
    )
    status, answer = await server.api("POST", "/api/v1/clusters/prod-eu/revoke")
    assert (status, answer["revoked_certificates"]) == (200, 1)
    status, error = await refusal(server, certificate)
    assert status == 403
    assert error["code"] == "certificate_revoked"
    assert "revoked" in error["message"]


async def test_certificate_of_an_unregistered_cluster_is_refused_with_cluster_unknown(
    server: RunningServer,
) -> None:
    await server.add_cluster("prod-eu")
    status, error = await refusal(server, client_certificate(server_ca(server), "ghost"))
    assert status == 403
    assert error["code"] == "cluster_unknown"
    assert "ghost" in error["message"]


async def test_no_client_certificate_is_refused_with_client_certificate_required(
    server: RunningServer,
) -> None:
    status, error = await refusal(server, None)
    assert status == 401
    assert error["code"] == "client_certificate_required"
    assert "bootstrap" in error["message"]


def busy_server_settings(state_dir: Path) -> ServerSettings:
    """A server that admits no agent handshake: every agent is told to come back later."""
    settings = server_settings(state_dir)
    tunnel = dataclasses.replace(settings.tunnel, max_pending_handshakes=0, max_retry_after=3.0)
    return dataclasses.replace(settings, tunnel=tunnel)


async def test_busy_server_answers_503_with_retry_after(tmp_path: Path) -> None:
    async with running_server(busy_server_settings(tmp_path / "state")) as server:
        await server.add_cluster("prod-eu")
        context = tls_for(server, client_certificate(server_ca(server), "prod-eu"))
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(agent_socket_url(server), ssl=context)
        assert refused.value.status == 503
        assert refused.value.headers is not None
        retry_after = refused.value.headers["Retry-After"]
        assert retry_after.isdigit()
        assert 1 <= int(retry_after) <= 3


@dataclass
class RecordingBackoff(Backoff):
    """A Backoff that remembers each (retry_after asked, delay given)."""

    delays: list[tuple[float | None, float]] = dataclasses.field(default_factory=list)

    def next_delay(self, retry_after: float | None = None) -> float:
        delay = super().next_delay(retry_after)
        self.delays.append((retry_after, delay))
        return delay


async def test_agent_facing_a_busy_server_waits_at_least_retry_after(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tunnel_agent.connector")
    async with running_server(busy_server_settings(tmp_path / "state")) as server:
        token = await server.add_cluster("prod-eu")
        # A cap above the server's largest Retry-After, as in production (5 min > 10 s).
        settings = agent_settings(server, "prod-eu", token, tmp_path / "creds", backoff_cap=30.0)
        backoff = RecordingBackoff(base=0.05, cap=30.0)
        async with running_agent(settings, backoff=backoff) as running:
            await until(lambda: bool(backoff.delays), max_turns=10**7)
            agent = running.agent
            assert not agent.connected.is_set()
            assert agent.bootstraps == 1  # bootstrap is not admission-limited
            assert agent.last_error is not None
            assert "busy" in agent.last_error
    [(retry_after, delay)] = backoff.delays
    assert retry_after is not None
    assert 1.0 <= retry_after <= 3.0
    assert delay >= retry_after
    # The attempt failed with a ConnectError that carries the server's Retry-After.
    [record] = [r for r in caplog.records if r.getMessage().startswith("cannot connect")]
    assert isinstance(record.args, tuple)
    error = record.args[0]
    assert isinstance(error, ConnectError)
    assert error.retry_after == retry_after
