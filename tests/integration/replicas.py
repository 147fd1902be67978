"""Several real server replicas in-process, on one fresh PostgreSQL database.

They share a CA from files of its own (as a mounted Secret would give it),
each has its state directory and internal port on loopback, and a
:mod:`tests.balancer` in front stands in for the Service agents dial.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from tests.balancer import Balancer, running_balancer
from tests.tunnel_server.store_engines import fresh_database
from tunnel_pki.ca import CertificateAuthority
from tunnel_server.app import start_server
from tunnel_server.config import ReplicaSettings, StoreSettings, TlsSettings

from .harness import RunningServer, server_settings

__all__ = ["Fleet", "running_fleet", "running_replica"]

#: A short lease and heartbeat, so that tests see fencing and lease loss promptly.
LEASE = 3.0
HEARTBEAT = 0.25


@dataclasses.dataclass
class Fleet:
    """The replicas, their balancer, and the database URL."""

    replicas: list[RunningServer]
    balancer: Balancer
    database: str
    ca_pem: bytes
    admin_token: str

    @property
    def url(self) -> str:
        """The balancer's URL: what agents and users know."""
        return f"https://{self.balancer.address}"


@contextlib.asynccontextmanager
async def running_replica(
    tmp_path: Path,
    name: str,
    database: str,
    ca: tuple[Path, Path],
    admin_token: str | None,
    lease: float = LEASE,
) -> AsyncIterator[RunningServer]:
    """One replica; the admin token is the first replica's (it created the admin)."""
    settings = server_settings(
        tmp_path / name,
        tls=TlsSettings(ca_cert_file=ca[0], ca_key_file=ca[1]),
        store=StoreSettings(database=database),
        replica=ReplicaSettings(
            name=name, peer_host="127.0.0.1", peer_port=0, lease=lease, heartbeat=HEARTBEAT
        ),
    )
    runner, port = await start_server(settings)
    server = RunningServer(settings, runner, port)
    server.url = f"https://127.0.0.1:{port}"
    server.ca_pem = ca[0].read_bytes()
    server.admin_token = admin_token or (settings.state_dir / "admin-token").read_text().strip()
    async with aiohttp.ClientSession() as http:
        server._http = http
        try:
            yield server
        finally:
            await server.stop()


@contextlib.asynccontextmanager
async def running_fleet(
    tmp_path: Path, count: int = 3, *, server: str | None = None, lease: float = LEASE
) -> AsyncIterator[Fleet]:
    """``count`` replicas named a, b, c... behind a balancer, on a fresh database (of the
    PostgreSQL server at ``server``, by default the tests' own)."""
    ca = CertificateAuthority.create()
    ca_files = (tmp_path / "ca.crt", tmp_path / "ca.key")
    ca_files[0].write_bytes(ca.cert_pem)
    ca_files[1].write_bytes(ca.key_pem)
    ca_files[1].chmod(0o600)
    async with fresh_database(server) as database, contextlib.AsyncExitStack() as stack:
        replicas: list[RunningServer] = []
        token: str | None = None
        for name in "abcdefgh"[:count]:
            replica = await stack.enter_async_context(
                running_replica(tmp_path, name, database, ca_files, token, lease)
            )
            token = replica.admin_token
            replicas.append(replica)
        backends = [("127.0.0.1", replica.port) for replica in replicas]
        balancer = await stack.enter_async_context(running_balancer(backends))
        assert token is not None
        yield Fleet(replicas, balancer, database, ca.cert_pem, token)
