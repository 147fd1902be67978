"""The TLS listener bounds handshakes in progress, and no client or address can hold them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import pytest

from tunnel_pki.ca import CertificateAuthority
from tunnel_pki.tls import client_context, server_context
from tunnel_server.edge.listener import BoundedTlsListener

from ...slow_clients import (
    NOT_CLIENT_HELLOS,
    client_hello,
    close_all,
    closed_by_server,
    raw_connection,
    stalled_after_client_hello,
)
from ...support import until


class Echo(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)


def listening(**options: Any) -> tuple[BoundedTlsListener, CertificateAuthority]:
    ca = CertificateAuthority.create()
    issued = ca.issue_server_certificate(["127.0.0.1"], lifetime=timedelta(days=1))
    assert issued.key_pem is not None
    context = server_context(issued.cert_pem, issued.key_pem, ca.cert_pem)
    return BoundedTlsListener(Echo, "127.0.0.1", 0, context, **options), ca


async def echoes(port: int, ca: CertificateAuthority, **options: Any) -> None:
    """A real TLS client from 127.0.0.1 gets its handshake done and its bytes echoed."""
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(
            "127.0.0.1",
            port,
            ssl=client_context(ca.cert_pem),
            server_hostname="127.0.0.1",
            **options,
        ),
        timeout=20,
    )
    writer.write(b"ping")
    assert await asyncio.wait_for(reader.readexactly(4), 20) == b"ping"
    writer.close()
    await writer.wait_closed()


async def test_silent_and_trickling_clients_hold_no_handshake_slot() -> None:
    listener, ca = listening(limit=1, handshake_timeout=60)
    port = await listener.start()
    try:
        silent = [await raw_connection(port) for _ in range(3)]
        trickling = [await raw_connection(port) for _ in range(3)]
        hello = client_hello(ca.cert_pem)
        trickling[0][1].write(hello[:3])  # part of the record's header
        trickling[1][1].write(hello[:7])  # the header and part of the message's
        trickling[2][1].write(hello[:-1])  # all but its last byte
        await until(lambda: listener.admission.waiting == 6)
        # The one slot is free for a client that sent its whole ClientHello.
        await echoes(port, ca)
        assert listener.admission.waiting == 6
        assert listener.admission.in_progress == 0
        await close_all(*silent, *trickling)
    finally:
        await listener.stop()


@pytest.mark.parametrize("first_bytes", NOT_CLIENT_HELLOS.values(), ids=NOT_CLIENT_HELLOS.keys())
async def test_what_is_no_client_hello_is_closed_at_once(first_bytes: bytes) -> None:
    listener, _ = listening(limit=1, handshake_timeout=60)
    port = await listener.start()
    try:
        stream = await raw_connection(port)
        stream[1].write(first_bytes)
        assert await closed_by_server(stream)
        assert listener.admission.not_tls == 1
        assert (listener.admission.waiting, listener.admission.in_progress) == (0, 0)
        await close_all(stream)
    finally:
        await listener.stop()


async def test_a_client_silent_past_the_deadline_is_closed() -> None:
    listener, _ = listening(limit=1, handshake_timeout=0.3)
    port = await listener.start()
    try:
        silent = await raw_connection(port)
        assert await closed_by_server(silent)
        assert listener.admission.timed_out == 1
        assert listener.admission.waiting == 0
        await close_all(silent)
    finally:
        await listener.stop()


async def test_a_stalled_handshake_is_abandoned_for_another_address() -> None:
    listener, ca = listening(limit=2, handshake_timeout=60, grace=0.2)
    durations: list[float] = []
    listener.observe_handshake = durations.append
    port = await listener.start()
    try:
        stalled = [
            await stalled_after_client_hello(port, ca.cert_pem, "127.0.0.2") for _ in range(2)
        ]
        await until(lambda: listener.admission.in_progress == 2)
        await echoes(port, ca)
        assert listener.admission.abandoned == 1
        assert await closed_by_server(stalled[0])
        assert len(durations) == 1  # the handshake done; not the one abandoned
        await close_all(*stalled)
    finally:
        await listener.stop()


async def test_past_the_bound_the_flooding_address_loses_its_own_oldest() -> None:
    listener, ca = listening(limit=1, held=3, handshake_timeout=60)
    port = await listener.start()
    try:
        bystander = await raw_connection(port, "127.0.0.1")
        await until(lambda: listener.admission.waiting == 1)
        flood = [await raw_connection(port, "127.0.0.2") for _ in range(3)]
        assert await closed_by_server(flood[0])
        assert listener.admission.closed_for_room == 1
        # The bystander's connection is still there: it speaks TLS now.
        reader, writer = bystander
        await asyncio.wait_for(
            writer.start_tls(client_context(ca.cert_pem), server_hostname="127.0.0.1"), 20
        )
        writer.write(b"ping")
        assert await asyncio.wait_for(reader.readexactly(4), 20) == b"ping"
        await close_all(bystander, *flood)
    finally:
        await listener.stop()


async def test_stop_closes_connections_waiting_for_their_client_hello() -> None:
    listener, _ = listening(limit=1, handshake_timeout=60)
    port = await listener.start()
    silent = await raw_connection(port)
    await until(lambda: listener.admission.waiting == 1)
    await listener.stop()
    assert await closed_by_server(silent)
    assert listener.admission.waiting == 0
    await close_all(silent)


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


async def test_out_of_file_descriptors_the_busiest_address_gives_one_back() -> None:
    listener, ca = listening(limit=1, handshake_timeout=60)
    port = await listener.start()
    flood = [await raw_connection(port, "127.0.0.2") for _ in range(20)]
    await until(lambda: listener.admission.waiting == 20)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    spare: list[int] = []
    try:
        # Every descriptor in use but one, which the client's socket takes:
        # the server's accept finds none left.
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 1, hard))
        with contextlib.suppress(OSError):
            while True:
                spare.append(os.open(os.devnull, os.O_RDONLY))
        os.close(spare.pop())
        await echoes(port, ca)
        # The flood gave back what the accepts needed (the loop may take one more).
        given_back = listener.admission.closed_for_room
        assert 1 <= given_back <= 2
        assert listener.admission.waiting == 20 - given_back
    finally:
        for descriptor in spare:
            os.close(descriptor)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        await close_all(*flood)
        await listener.stop()
