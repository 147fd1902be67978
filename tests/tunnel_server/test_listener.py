"""The TLS listener bounds handshakes in progress and drops silent clients."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

from tunnel_pki.ca import CertificateAuthority
from tunnel_pki.tls import client_context, server_context
from tunnel_server.listener import BoundedTlsListener


class Echo(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)


async def test_a_silent_client_cannot_hold_the_only_handshake_slot(tmp_path: Path) -> None:
    ca = CertificateAuthority.create()
    issued = ca.issue_server_certificate(["127.0.0.1"], lifetime=timedelta(days=1))
    assert issued.key_pem is not None
    listener = BoundedTlsListener(
        Echo,
        "127.0.0.1",
        0,
        server_context(issued.cert_pem, issued.key_pem, ca.cert_pem),
        limit=1,
        handshake_timeout=0.5,
    )
    port = await listener.start()
    try:
        # Takes the one slot and never speaks TLS.
        silent_reader, silent_writer = await asyncio.open_connection("127.0.0.1", port)
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(
                "127.0.0.1", port, ssl=client_context(ca.cert_pem), server_hostname="127.0.0.1"
            ),
            timeout=10,
        )
        writer.write(b"ping")
        assert await asyncio.wait_for(reader.readexactly(4), 10) == b"ping"
        # The silent client was dropped when its handshake timed out.
        assert await asyncio.wait_for(silent_reader.read(), 10) == b""
        writer.close()
        silent_writer.close()
        await writer.wait_closed()
        await silent_writer.wait_closed()
    finally:
        await listener.stop()


async def test_many_clients_all_get_through_a_small_bound(tmp_path: Path) -> None:
    ca = CertificateAuthority.create()
    issued = ca.issue_server_certificate(["127.0.0.1"], lifetime=timedelta(days=1))
    assert issued.key_pem is not None
    listener = BoundedTlsListener(
        Echo, "127.0.0.1", 0, server_context(issued.cert_pem, issued.key_pem, ca.cert_pem), limit=2
    )
    port = await listener.start()
    context = client_context(ca.cert_pem)

    async def round_trip(number: int) -> bytes:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=context, server_hostname="127.0.0.1"
        )
        writer.write(f"{number:04d}".encode())
        echoed = await reader.readexactly(4)
        writer.close()
        await writer.wait_closed()
        return echoed

    try:
        results = await asyncio.wait_for(asyncio.gather(*map(round_trip, range(50))), 60)
        assert results == [f"{n:04d}".encode() for n in range(50)]
    finally:
        await listener.stop()
