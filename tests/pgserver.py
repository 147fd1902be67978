"""A private PostgreSQL server a test may stop and start (Debian's binaries).

Made as scripts/postgres.sh makes the suite's fallback server: a cluster in a
temporary directory, trust authentication, a free port on 127.0.0.1, run as
``nobody`` when the tests run as root (PostgreSQL refuses root). The tests
that restart the database use one of their own, never the machine's shared
server.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = ["PrivatePostgres", "private_postgres"]


def _binaries() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: p.parts[-3])
    if not found:
        pytest.fail(
            "no PostgreSQL binaries in /usr/lib/postgresql/*/bin: scripts/test installs "
            "Debian's postgresql package when it starts its own server",
            pytrace=False,
        )
    return found[-1].parent


@dataclass
class PrivatePostgres:
    directory: Path
    port: int
    binaries: Path

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    async def _pg_ctl(self, *args: str) -> None:
        command = [str(self.binaries / "pg_ctl"), "-D", str(self.directory / "data"), *args]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "nobody", "--", *command]
        process = await asyncio.create_subprocess_exec(
            *command, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
        )
        _, stderr = await process.communicate()
        if process.returncode != 0:
            log = (self.directory / "server.log").read_text(errors="replace")[-2000:]
            raise AssertionError(f"pg_ctl {args[-1]} failed: {stderr.decode()}\n{log}")

    async def start(self) -> None:
        """Start the server and wait until it takes connections."""
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.directory / 'socket'}"
            # Durable commits (not the suite's scratch server's settings): a test that
            # stops it abruptly must find what was committed.
            " -c max_connections=100"
        )
        await self._pg_ctl("-l", str(self.directory / "server.log"), "-o", options, "-w", "start")

    async def stop(self) -> None:
        """Stop at once, as a crash or a failover would (connections are cut)."""
        await self._pg_ctl("-m", "immediate", "-w", "stop")


def _prepare(directory: Path) -> None:
    """The server's directories, the unprivileged user's when the tests run as root."""
    (directory / "data").mkdir()
    (directory / "socket").mkdir()
    (directory / "data").chmod(0o700)
    directory.chmod(0o755)
    if os.geteuid() == 0:
        for path in (directory, *directory.rglob("*")):
            shutil.chown(path, "nobody")


@contextlib.asynccontextmanager
async def private_postgres() -> AsyncIterator[PrivatePostgres]:
    """A fresh server, stopped and removed afterwards."""
    binaries = _binaries()
    # Under /tmp itself: pytest's own temporary directories are root's alone.
    directory = Path(tempfile.mkdtemp(prefix="tunnel-test-postgres-"))
    await asyncio.to_thread(_prepare, directory)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = PrivatePostgres(directory, port, binaries)
    initdb = [
        str(binaries / "initdb"),
        "-D",
        str(directory / "data"),
        "-U",
        "postgres",
        "--auth=trust",
        "--encoding=UTF8",
        "--locale=C",
        "--no-sync",
    ]
    if os.geteuid() == 0:
        initdb = ["runuser", "-u", "nobody", "--", *initdb]
    process = await asyncio.create_subprocess_exec(
        *initdb, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    _, stderr = await process.communicate()
    assert process.returncode == 0, stderr.decode()
    await server.start()
    try:
        yield server
    finally:
        with contextlib.suppress(AssertionError):
            await server.stop()
        shutil.rmtree(directory, ignore_errors=True)
