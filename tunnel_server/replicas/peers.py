"""A replica's share of a running server: its certificate, internal port, links, membership.

Started once the public port listens, when the server shares its database
(:class:`RunningReplica`): the replica issues itself a certificate from the
server CA for the address others reach it at, listens on its internal port,
joins the replicas in the database and keeps its heartbeat. Stopped after
its agents were told to go (GOAWAY), so that its sessions are released only
when their agents are already on their way elsewhere.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket

from aiohttp import web

from tunnel_pki.ca import CertificateAuthority
from tunnel_pki.errors import PkiError
from tunnel_server.agents.registry import AgentRegistry
from tunnel_server.clock import utcnow
from tunnel_server.config import ReplicaSettings, TunnelSettings
from tunnel_server.errors import ConfigError
from tunnel_server.replicas.links import PeerLinks, ReplicaTls, peer_app
from tunnel_server.replicas.membership import Membership

__all__ = ["RunningReplica", "advertised_host"]

logger = logging.getLogger(__name__)

_WILDCARDS = frozenset({"0.0.0.0", "::", ""})  # noqa: S104 - recognising, not binding


def advertised_host(settings: ReplicaSettings) -> str:
    """The host other replicas dial: the advertised one, the internal port's, or this
    host's name."""
    if settings.advertise is not None:
        return settings.advertise.rpartition(":")[0].strip("[]")
    if settings.peer_host not in _WILDCARDS:
        return settings.peer_host
    return socket.gethostname()


class RunningReplica:
    """Holds the internal port and the membership of a started server (made before it
    starts, filled by :meth:`start`)."""

    def __init__(self) -> None:
        self._stack = contextlib.AsyncExitStack()
        self.links: PeerLinks | None = None
        #: ``host:port`` other replicas reach this one at, once started.
        self.address: str | None = None

    async def start(
        self,
        settings: ReplicaSettings,
        tunnel: TunnelSettings,
        ca: CertificateAuthority,
        registry: AgentRegistry,
        membership: Membership,
    ) -> PeerLinks:
        """Listen on the internal port and join the others; the links to dial them."""
        host = advertised_host(settings)
        try:
            issued = ca.issue_replica_certificate(
                settings.name,
                list(dict.fromkeys([host, "localhost", "127.0.0.1"])),
                settings.certificate_lifetime,
                now=utcnow(),
            )
        except PkiError as exc:
            raise ConfigError(
                f"cannot issue replica {settings.name}'s certificate for {host}: {exc}; "
                "set --advertise-address to an address or DNS name"
            ) from exc
        assert issued.key_pem is not None
        tls = ReplicaTls(settings.name, issued.cert_pem, issued.key_pem, ca.cert_pem, utcnow)
        try:
            runner = web.AppRunner(
                peer_app(registry, tls, tunnel.limits, tunnel.keepalive),
                handle_signals=False,
                access_log=None,
                shutdown_timeout=tunnel.shutdown_grace,
            )
            await runner.setup()
            self._stack.push_async_callback(runner.cleanup)
            site = web.TCPSite(
                runner, settings.peer_host, settings.peer_port, ssl_context=tls.server_context()
            )
            try:
                await site.start()
            except OSError as exc:
                raise ConfigError(
                    f"cannot listen on the internal port {settings.peer_host}:"
                    f"{settings.peer_port}: {exc.strerror}"
                ) from exc
            port = _bound_port(site)
            self.address = settings.advertise or f"{_bracketed(host)}:{port}"
            links = PeerLinks(tls, tunnel.limits, tunnel.keepalive)
            self._stack.push_async_callback(links.close)
            self.links = links
            await self._stack.enter_async_context(membership.running(self.address))
        except BaseException:
            await self.stop()
            raise
        return links

    async def stop(self) -> None:
        """Leave the replicas (releasing every session), close the links and the port."""
        await self._stack.aclose()


def _bound_port(site: web.TCPSite) -> int:
    server = site._server
    assert server is not None
    sockets = getattr(server, "sockets", None) or ()
    for sock in sockets:
        return int(sock.getsockname()[1])
    raise ConfigError("the internal port is not listening")


def _bracketed(host: str) -> str:
    try:
        return f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:
        return host
