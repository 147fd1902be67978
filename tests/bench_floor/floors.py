"""What the floor relays' process tests share: certificates, the upstream, the relay's two ends.

The upstream lives in the test's event loop, so a test sees what arrives there
and when its connections close.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.procs import Children

MIB = 1024 * 1024
#: Patience for one step (a read, a close, a process saying something).
PATIENCE = 10.0
#: The large response: random, so that a lost, doubled or reordered piece shows.
BIG = os.urandom(4 * MIB)
CHUNK = 64 * 1024


def request(path: str, *extra: str) -> bytes:
    lines = [f"GET {path} HTTP/1.1", "Host: 127.0.0.1", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def head(length: int, *extra: str) -> bytes:
    lines = ["HTTP/1.1 200 OK", f"Content-Length: {length}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def answer(body: bytes, *extra: str) -> bytes:
    return head(len(body), *extra) + body


@dataclass
class Certificates:
    cert: Path
    key: Path
    ca: Path


class UpstreamConnection(asyncio.Protocol):
    """One connection the relay made to the upstream.

    It answers each request with its path as the body, ``/big`` with
    :data:`BIG` (written as a server does: while the socket takes it), and
    ``/last`` with the path and ``Connection: close``, closing after.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.received = bytearray()
        self._unanswered = 0
        self.closed = asyncio.Event()
        self._paused = False
        self._big_left = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.received += data
        while (end := self.received.find(b"\r\n\r\n", self._unanswered)) >= 0:
            path = bytes(self.received[self._unanswered : end]).split(b" ")[1]
            self._unanswered = end + 4
            if path == b"/big":
                self.transport.write(head(len(BIG)))
                self._big_left = len(BIG)
                self._pump()
            elif path == b"/last":
                self.transport.write(answer(path, "Connection: close"))
                self.transport.close()
            else:
                self.transport.write(answer(path))

    def _pump(self) -> None:
        while self._big_left and not self._paused and self.transport is not None:
            start = len(BIG) - self._big_left
            self.transport.write(BIG[start : start + CHUNK])
            self._big_left -= min(CHUNK, self._big_left)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._pump()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.closed.set()


@dataclass
class Upstream:
    port: int
    connections: asyncio.Queue[UpstreamConnection] = field(default_factory=asyncio.Queue)

    async def next_connection(self) -> UpstreamConnection:
        return await asyncio.wait_for(self.connections.get(), PATIENCE)


@dataclass
class Relay:
    children: Children
    near: asyncio.subprocess.Process
    far: asyncio.subprocess.Process
    port: int
    ca: Path

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A client connection to the near end, over TLS that trusts the test CA only."""
        context = ssl.create_default_context(cafile=str(self.ca))
        return await asyncio.wait_for(
            asyncio.open_connection(
                "127.0.0.1", self.port, ssl=context, server_hostname="127.0.0.1"
            ),
            PATIENCE,
        )


async def said(process: asyncio.subprocess.Process) -> dict[str, Any]:
    """The next JSON line ``process`` writes to stdout."""
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), PATIENCE)
    assert line, f"the process exited (status {process.returncode}); see its log"
    said: dict[str, Any] = json.loads(line)
    return said
