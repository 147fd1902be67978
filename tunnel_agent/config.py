"""The agent's settings, grouped by concern, built once by the CLI."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from protocol import Keepalive, Limits
from tunnel_commands.spec import ALL_COMMAND_TYPES

from .policy import ProxyPolicy

__all__ = ["AgentSettings", "ConnectSettings"]


@dataclass(frozen=True, slots=True)
class ConnectSettings:
    """How the agent reaches the server and stays connected."""

    limits: Limits = field(default_factory=Limits)
    keepalive: Keepalive = field(default_factory=Keepalive)
    backoff_base: float = 1.0
    backoff_cap: float = 300.0
    #: A connection up this long resets the back-off.
    stable_after: float = 30.0
    #: TCP + TLS + WebSocket upgrade, and then the HELLO exchange.
    connect_timeout: float = 30.0
    handshake_timeout: float = 10.0
    #: Renew the certificate once this fraction of its lifetime has passed.
    renew_at: float = 0.5


@dataclass(frozen=True, slots=True)
class AgentSettings:
    server_url: str
    #: The server CA bundle the agent pins (PEM).
    ca_pem: bytes = field(repr=False)
    cluster: str
    bootstrap_token: str | None = field(default=None, repr=False)
    #: ``(namespace, name)`` of the credentials Secret, or None with credentials_dir.
    credentials_secret: tuple[str, str] | None = None
    credentials_dir: Path | None = None
    kubeconfig: Path | None = None
    health_listen: tuple[str, int] | None = None
    connect: ConnectSettings = field(default_factory=ConnectSettings)
    commands_concurrency: int = 2
    #: The command types this agent runs (--command-types).
    command_types: frozenset[str] = ALL_COMMAND_TYPES
    #: Whether git sources may be file:// paths in the agent's pod (--allow-file-git-sources).
    allow_file_git_sources: bool = False
    proxy: ProxyPolicy = field(default_factory=ProxyPolicy)
    #: In a cluster: the image of runs' Jobs (the agent's own); None runs steps in this pod.
    run_image: str | None = None
    #: Where the commands' gateway listens (a Job's pod reaches it) and the host runs are told.
    gateway_listen: tuple[str, int] = ("127.0.0.1", 0)
    gateway_host: str | None = None
