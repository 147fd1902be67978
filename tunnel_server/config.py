"""The server's settings, grouped by concern, built once by the CLI."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

from protocol import Keepalive, Limits
from tunnel_server.edge.callerlimit import DEFAULT_MAX_CALLER_CONNECTIONS
from tunnel_server.edge.handshakes import (
    DEFAULT_GRACE,
    DEFAULT_HANDSHAKES,
    DEFAULT_HELD,
    DEFAULT_TIMEOUT,
)
from tunnel_server.errors import ConfigError

__all__ = [
    "CommandSettings",
    "IdentitySettings",
    "ListenSettings",
    "ReplicaSettings",
    "ServerSettings",
    "StoreSettings",
    "TlsSettings",
    "TunnelSettings",
]


@dataclass(frozen=True, slots=True)
class ListenSettings:
    """Where the one TLS port listens, and the URL agents and users reach it by."""

    host: str = "0.0.0.0"  # noqa: S104 - a server listens on every interface by default
    port: int = 8443
    public_url: str = "https://localhost:8443"

    @property
    def public_host(self) -> str:
        host = urlsplit(self.public_url).hostname
        if not host:
            raise ConfigError(f"public URL {self.public_url!r} has no host")
        return host

    def __post_init__(self) -> None:
        parts = urlsplit(self.public_url)
        if parts.scheme != "https" or not parts.hostname:
            raise ConfigError(f"public URL must be https://HOST[:PORT], not {self.public_url!r}")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port {self.port} is outside 0..65535")


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """A serving certificate of one's own; by default the server issues one."""

    cert_file: Path | None = None
    key_file: Path | None = None
    #: The CA bundle clients should pin when cert_file is not from our CA.
    ca_file: Path | None = None
    #: The tunnel CA (certificate and key) from files of its own, e.g. a Secret that
    #: every replica mounts; None: ``ca.crt`` and ``ca.key`` in the state directory.
    ca_cert_file: Path | None = None
    ca_key_file: Path | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ConfigError("--tls-cert and --tls-key go together")
        if (self.ca_cert_file is None) != (self.ca_key_file is None):
            raise ConfigError("--ca-cert and --ca-key go together")


#: The shortest and the longest lifetime an API token may have.
MIN_API_TOKEN_TTL = timedelta(minutes=1)
MAX_API_TOKEN_TTL = timedelta(days=3650)


@dataclass(frozen=True, slots=True)
class IdentitySettings:
    """Lifetimes of what the server issues."""

    bootstrap_token_ttl: timedelta = timedelta(hours=24)
    client_cert_lifetime: timedelta = timedelta(days=30)
    server_cert_lifetime: timedelta = timedelta(days=365)
    #: The longest an API token may live, and the lifetime of one asked without
    #: a ``ttl``; None: a token lives until revoked unless it asks for a ``ttl``.
    max_api_token_ttl: timedelta | None = None


@dataclass(frozen=True, slots=True)
class TunnelSettings:
    """Agent sockets: protocol limits, keepalive, admission and shutdown."""

    limits: Limits = field(default_factory=Limits)
    keepalive: Keepalive = field(default_factory=Keepalive)
    #: How long open streams may finish at shutdown before the socket closes.
    shutdown_grace: float = 30.0
    #: How long a replaced agent's open streams may finish.
    replace_grace: float = 10.0
    #: TLS handshakes in progress at once (tunnel_server/edge/handshakes.py).
    max_tls_handshakes: int = DEFAULT_HANDSHAKES
    #: Connections accepted whose handshake has not started (waiting for their
    #: ClientHello or a slot); past it, the oldest of the busiest address goes.
    max_tls_held: int = DEFAULT_HELD
    #: Seconds a handshake runs before it may be abandoned for another address's.
    tls_handshake_grace: float = DEFAULT_GRACE
    #: Seconds from accept by which a connection's handshake must be done.
    tls_handshake_timeout: float = DEFAULT_TIMEOUT
    #: Bytes asyncio reads from a TLS socket at once. CPython's default of 256 KiB
    #: is allocated per connection and dominates an idle agent's cost
    #: (docs/benchmarks.md, "Idle agents"); 64 KiB is four TLS records. Only for
    #: asyncio's loop: uvloop allocates its buffer without touching its pages.
    tls_read_buffer: int = 64 * 1024
    #: Agent sessions being set up at once; beyond it agents get 503 + Retry-After.
    max_pending_handshakes: int = 256
    #: The most seconds a refused agent is told to wait (it is told a random part).
    max_retry_after: float = 10.0
    #: How long an agent has from WebSocket upgrade to HELLO.
    handshake_timeout: float = 10.0
    #: How long the WebSocket closing handshake may take (a dead peer never answers).
    close_timeout: float = 2.0
    #: Proxied requests one user may have in progress on one cluster: half the
    #: streams a session carries, so no one user can take them all.
    max_requests_per_user: int = 1024
    #: Connections callers (not agents) may hold open at once (tunnel_server/edge/callerlimit.py).
    max_caller_connections: int = DEFAULT_MAX_CALLER_CONNECTIONS
    #: The most of them one source address holds (None: half of them).
    max_caller_connections_per_address: int | None = None


@dataclass(frozen=True, slots=True)
class CommandSettings:
    """Timing and bounds of command delivery."""

    #: How long an agent holds a command without news before it counts as lost.
    lease: float = 30.0
    #: How long past its lease a command waits for its agent to come back when
    #: the agent is not connected (or since this server started, if later):
    #: agents that lost their server dial again within their back-off (at most
    #: 5 minutes) and resume what they run. A connected agent's leases are
    #: judged once it has been connected for a lease and heard from since.
    agent_return_grace: float = 360.0
    #: How often leases are checked.
    reap_interval: float = 1.0
    #: How long an agent has to accept or refuse an offer.
    offer_timeout: float = 10.0
    #: Bytes of log kept per command.
    log_cap: int = 1024 * 1024
    #: Commands a cluster may have waiting for delivery; past it, submissions get 429.
    max_pending: int = 10_000


@dataclass(frozen=True, slots=True)
class StoreSettings:
    """Where the server keeps its state: SQLite in the state directory, or PostgreSQL."""

    #: A PostgreSQL URL (``postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE``) of a
    #: database several replicas may share; None: the SQLite file ``state.db`` in the
    #: state directory. Kept out of ``repr`` so that a password never reaches a log.
    database: str | None = field(default=None, repr=False)
    #: The most connections to PostgreSQL this server opens.
    max_connections: int = 10
    #: Seconds a PostgreSQL statement may run before the server cancels it.
    statement_timeout: float = 10.0

    def __post_init__(self) -> None:
        if self.database is not None:
            scheme = urlsplit(self.database).scheme
            if scheme not in ("postgresql", "postgres"):
                raise ConfigError(
                    "the state database must be a postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE"
                    f" URL, not one of scheme {scheme!r} (leave it unset for SQLite in the"
                    " state directory)"
                )
        if self.max_connections < 1:
            raise ConfigError("the database pool needs at least one connection")
        if self.statement_timeout <= 0:
            raise ConfigError("the database statement timeout must be positive")


@dataclass(frozen=True, slots=True)
class ReplicaSettings:
    """How a replica finds and serves the others that share its PostgreSQL database.

    Used only with a database (``StoreSettings.database``): a server on SQLite
    is the only replica of its state.
    """

    #: This replica's name among the others (a DNS label; default: the host's name).
    name: str = "solo"
    #: Host and port of the internal port, where other replicas send the requests of
    #: the clusters whose agents this replica holds (mTLS, replicas only).
    peer_host: str = "0.0.0.0"  # noqa: S104 - the pod's address is not known here
    peer_port: int = 8444
    #: ``host:port`` other replicas dial to reach the internal port; None: the peer
    #: host (if not a wildcard) or the host's name, and the bound port.
    advertise: str | None = None
    #: Seconds a replica's hold on its sessions lasts without a heartbeat.
    lease: float = 10.0
    #: Seconds between heartbeats (which renew the lease).
    heartbeat: float = 2.0
    #: Lifetime of the certificate each replica issues itself for the internal port.
    certificate_lifetime: timedelta = timedelta(days=30)

    def __post_init__(self) -> None:
        if not REPLICA_NAME.fullmatch(self.name):
            raise ConfigError(
                f"the replica name {self.name[:80]!r} is not valid: use 1 to 63 characters of "
                "lowercase a-z, 0-9 and '-', starting and ending with a letter or digit"
            )
        if not 0 <= self.peer_port <= 65535:
            raise ConfigError(f"the peer port {self.peer_port} is not a TCP port")
        if self.heartbeat <= 0 or self.lease < 2 * self.heartbeat:
            raise ConfigError(
                "the replica lease must last at least two heartbeats, and heartbeats be positive"
            )


#: A replica's name: one DNS label, as a cluster's.
REPLICA_NAME = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")


@dataclass(frozen=True, slots=True)
class ServerSettings:
    state_dir: Path
    listen: ListenSettings = field(default_factory=ListenSettings)
    tls: TlsSettings = field(default_factory=TlsSettings)
    identity: IdentitySettings = field(default_factory=IdentitySettings)
    tunnel: TunnelSettings = field(default_factory=TunnelSettings)
    commands: CommandSettings = field(default_factory=CommandSettings)
    store: StoreSettings = field(default_factory=StoreSettings)
    replica: ReplicaSettings = field(default_factory=ReplicaSettings)
    #: How long audit events are kept.
    audit_retention: timedelta = timedelta(days=90)
    #: How long a finished command (its record, result and log) is kept.
    command_retention: timedelta = timedelta(days=30)
    #: The agent image the install manifest names.
    agent_image: str = "ghcr.io/example/tunnel-agent:0.1.0"
