"""Clients that connect and then hold back: the floods a TLS listener must withstand."""

from __future__ import annotations

import asyncio
import contextlib
import ssl

from tunnel_pki.tls import client_context

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]

#: First bytes that cannot begin a ClientHello, by what they are.
NOT_CLIENT_HELLOS = {
    "an alert": b"\x15\x03\x01\x00\x02\x02\x28",
    "application data": b"\x17\x03\x03\x00\x10",
    "a record of another major version": b"\x16\x02\x00\x00\x30",
    "an empty record": b"\x16\x03\x01\x00\x00",
    "a record over 2^14 bytes": b"\x16\x03\x01\x40\x01",
    "a ServerHello": b"\x16\x03\x01\x00\x30\x02\x00\x00\x2c",
    "a ClientHello too short": b"\x16\x03\x01\x00\x30\x01\x00\x00\x10",
    "a ClientHello over 64 KiB": b"\x16\x03\x01\x00\x30\x01\x01\x00\x00",
    "plain HTTP": b"GET / HTTP/1.1\r\n",
    "an SSLv2 ClientHello": b"\x80\x2e\x01\x00\x02",
}


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
