"""Clients that connect and then hold back: the floods a TLS listener must withstand."""

from __future__ import annotations

import asyncio
import contextlib
import ssl

from tunnel_pki.tls import client_context

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def raw_connection(port: int, source: str = "127.0.0.1") -> Stream:
    """A TCP connection to 127.0.0.1:port from ``source``, saying nothing yet."""
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))


def client_hello(ca_pem: bytes) -> bytes:
    """A real client's first flight: its ClientHello, in one record."""
    outgoing = ssl.MemoryBIO()
    tls = client_context(ca_pem).wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname="127.0.0.1")
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


async def stalled_after_client_hello(port: int, ca_pem: bytes, source: str) -> Stream:
    """A client that sends a real ClientHello and never answers the server's flight."""
    reader, writer = await raw_connection(port, source)
    writer.write(client_hello(ca_pem))
    return reader, writer


async def closed_by_server(stream: Stream) -> bool:
    """Whether the server closed this connection (whatever it sent before).

    A reset counts: a server that closes a socket with bytes it has not read
    resets the connection.
    """
    reader, _ = stream
    try:
        await asyncio.wait_for(reader.read(), 20)
    except ConnectionResetError:
        return True
    return reader.at_eof()


async def close_all(*streams: Stream) -> None:
    for _, writer in streams:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
