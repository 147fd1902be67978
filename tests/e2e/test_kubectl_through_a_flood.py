"""The real kubectl gets through while a flood holds the server's TLS handshake slots.

Before handshake slots were taken only for a whole ClientHello, and shared by
source address, 64 connections that never finished their handshake kept every
kubectl (and every agent) out until their deadline.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.e2e import test_kubectl_tunnel as kubectl_e2e
from tests.e2e.test_kubectl_tunnel import Tunnel
from tunnel_server.app import LISTENER

from ..integration.harness import RunningServer, running_server, server_settings
from ..slow_clients import close_all, raw_connection, stalled_after_client_hello
from ..support import until

tunnel = kubectl_e2e.tunnel


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[RunningServer]:
    """A server whose handshakes may take a minute: longer than kubectl waits here."""
    base = server_settings(tmp_path / "state")
    patient = dataclasses.replace(base.tunnel, tls_handshake_timeout=60.0, tls_handshake_grace=0.5)
    async with running_server(dataclasses.replace(base, tunnel=patient)) as running:
        yield running


async def test_kubectl_gets_through_silent_and_stalled_connections(tunnel: Tunnel) -> None:
    port = tunnel.server.port
    admission = tunnel.server.runner.app[LISTENER].admission
    silent = [await raw_connection(port, "127.0.0.2") for _ in range(100)]
    stalled = [
        await stalled_after_client_hello(port, tunnel.server.ca_pem, "127.0.0.2")
        for _ in range(admission.handshakes + 6)
    ]
    try:
        await until(lambda: admission.in_progress == admission.handshakes)
        result = await tunnel.kubectl.run("get", "pods", "-o", "name", "--request-timeout=20s")
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == ["pod/demo"]
        assert admission.abandoned >= 1
    finally:
        await close_all(*silent, *stalled)
