"""The ``tunnel-server`` command: ``tunnel-server serve``."""

from __future__ import annotations

import argparse
import logging
import sys
from datetime import timedelta
from pathlib import Path

from protocol import Keepalive
from protocol.errors import TunnelError
from tunnel_cli import (
    EVENT_LOOPS,
    configure_logging,
    describe_duration,
    env_flag,
    parse_duration,
    run_main,
)
from tunnel_server import __version__
from tunnel_server.config import (
    MAX_API_TOKEN_TTL,
    MIN_API_TOKEN_TTL,
    CommandSettings,
    IdentitySettings,
    ListenSettings,
    ServerSettings,
    StoreSettings,
    TlsSettings,
    TunnelSettings,
)
from tunnel_server.errors import ConfigError
from tunnel_server.retention import MIN_RETENTION

__all__ = ["build_parser", "main", "settings_from_args"]

logger = logging.getLogger("tunnel_server")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tunnel-server", description="Reverse-tunnel server for private Kubernetes clusters."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the server")
    env = "TUNNEL_SERVER_"
    env_flag(
        serve,
        "--state-dir",
        env + "STATE_DIR",
        default="./state",
        help="directory for the CA, certificates, admin token and database",
    )
    env_flag(
        serve,
        "--database",
        env + "DATABASE",
        default=None,
        help="postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE of a PostgreSQL database "
        "that server replicas share (default: the SQLite file state.db in --state-dir)",
    )
    env_flag(
        serve,
        "--listen",
        env + "LISTEN",
        default="0.0.0.0:8443",
        help="HOST:PORT of the one TLS port",
    )
    env_flag(
        serve,
        "--public-url",
        env + "PUBLIC_URL",
        default=None,
        help="https URL agents and users reach the server by (default from --listen)",
    )
    env_flag(serve, "--tls-cert", env + "TLS_CERT", help="serving certificate (PEM, with chain)")
    env_flag(serve, "--tls-key", env + "TLS_KEY", help="key of --tls-cert")
    env_flag(serve, "--tls-ca", env + "TLS_CA", help="CA bundle clients pin, with --tls-cert")
    env_flag(
        serve,
        "--bootstrap-token-ttl",
        env + "BOOTSTRAP_TOKEN_TTL",
        default="24h",
        help="lifetime of bootstrap tokens",
    )
    env_flag(
        serve,
        "--max-api-token-ttl",
        env + "MAX_API_TOKEN_TTL",
        default=None,
        help="the longest an API token may live, and the lifetime of one asked without --ttl "
        "(default: tokens live until revoked, unless made with --ttl)",
    )
    env_flag(
        serve,
        "--client-cert-lifetime",
        env + "CLIENT_CERT_LIFETIME",
        default="30d",
        help="lifetime of agents' client certificates",
    )
    env_flag(
        serve,
        "--keepalive-interval",
        env + "KEEPALIVE_INTERVAL",
        default="15s",
        help="ping an agent after this much silence",
    )
    env_flag(
        serve,
        "--keepalive-timeout",
        env + "KEEPALIVE_TIMEOUT",
        default="15s",
        help="drop an agent that does not answer a ping within this",
    )
    env_flag(
        serve,
        "--keepalive-probe-timeout",
        env + "KEEPALIVE_PROBE_TIMEOUT",
        default="5s",
        help="drop an agent that does not answer within this the ping sent with a request "
        "after a second of silence (a request fails fast on a link gone dead)",
    )
    env_flag(
        serve,
        "--shutdown-grace",
        env + "SHUTDOWN_GRACE",
        default="30s",
        help="how long open streams may finish at shutdown",
    )
    env_flag(
        serve,
        "--audit-retention",
        env + "AUDIT_RETENTION",
        default="90d",
        help="how long audit events are kept (at least 1h)",
    )
    env_flag(
        serve,
        "--command-retention",
        env + "COMMAND_RETENTION",
        default="30d",
        help="how long a finished command, its result and its log are kept (at least 1h)",
    )
    env_flag(
        serve,
        "--max-requests-per-user",
        env + "MAX_REQUESTS_PER_USER",
        default=str(TunnelSettings.__dataclass_fields__["max_requests_per_user"].default),
        help="kubectl requests one user may have in progress on one cluster (more get 429)",
    )
    env_flag(
        serve,
        "--max-caller-connections",
        env + "MAX_CALLER_CONNECTIONS",
        default=str(TunnelSettings.__dataclass_fields__["max_caller_connections"].default),
        help="connections callers (not agents) may hold open at once; past it the longest "
        "idle one is closed, or the new one answered 503",
    )
    env_flag(
        serve,
        "--max-caller-connections-per-address",
        env + "MAX_CALLER_CONNECTIONS_PER_ADDRESS",
        default=None,
        help="of those, the most one address (IPv4, or IPv6 /48) may hold; past it its own "
        "longest idle one is closed, or its new one answered 503 (default: half of "
        "--max-caller-connections)",
    )
    env_flag(
        serve,
        "--tls-handshake-timeout",
        env + "TLS_HANDSHAKE_TIMEOUT",
        default="10s",
        help="close a connection whose TLS handshake is not done this long after its accept",
    )
    env_flag(
        serve,
        "--tls-handshake-grace",
        env + "TLS_HANDSHAKE_GRACE",
        default="2s",
        help="when every handshake slot is taken, one running this long may be abandoned for "
        "a connection from an address that holds fewer",
    )
    env_flag(
        serve,
        "--max-pending-commands",
        env + "MAX_PENDING_COMMANDS",
        default=str(CommandSettings.__dataclass_fields__["max_pending"].default),
        help="commands a cluster may have waiting for delivery (more get 429)",
    )
    env_flag(
        serve,
        "--agent-return-grace",
        env + "AGENT_RETURN_GRACE",
        default="6m",
        help="how long a command whose agent is not connected waits past its lease "
        "(and past this server's start) for the agent to come back and resume it, "
        "before it counts as lost",
    )
    env_flag(
        serve,
        "--agent-image",
        env + "AGENT_IMAGE",
        default=ServerSettings.__dataclass_fields__["agent_image"].default,
        help="agent image named in install manifests",
    )
    env_flag(
        serve,
        "--log-format",
        env + "LOG_FORMAT",
        default="text",
        choices=["text", "json"],
        help="log format",
    )
    env_flag(serve, "--log-level", env + "LOG_LEVEL", default="info", help="log level")
    env_flag(
        serve,
        "--event-loop",
        env + "EVENT_LOOP",
        default="auto",
        choices=list(EVENT_LOOPS),
        help="event loop: uvloop when installed (auto), or force uvloop or asyncio",
    )
    return parser


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    host, _, port_text = str(args.listen).rpartition(":")
    if not host or not port_text.isdigit():
        raise ConfigError(f"--listen must be HOST:PORT, not {args.listen!r}")
    port = int(port_text)
    local = host in {"0.0.0.0", "::", "[::]"}  # noqa: S104 - recognising, not binding
    public_url = args.public_url or f"https://{'localhost' if local else host}:{port}"
    return ServerSettings(
        state_dir=Path(args.state_dir),
        listen=ListenSettings(host=host.strip("[]"), port=port, public_url=public_url),
        tls=TlsSettings(
            cert_file=_path(args.tls_cert), key_file=_path(args.tls_key), ca_file=_path(args.tls_ca)
        ),
        identity=IdentitySettings(
            bootstrap_token_ttl=parse_duration(args.bootstrap_token_ttl),
            client_cert_lifetime=parse_duration(args.client_cert_lifetime),
            max_api_token_ttl=_token_ttl(args.max_api_token_ttl),
        ),
        tunnel=TunnelSettings(
            keepalive=Keepalive(
                interval=parse_duration(args.keepalive_interval).total_seconds(),
                timeout=parse_duration(args.keepalive_timeout).total_seconds(),
                probe_timeout=parse_duration(args.keepalive_probe_timeout).total_seconds(),
            ),
            shutdown_grace=parse_duration(args.shutdown_grace).total_seconds(),
            max_requests_per_user=_positive(args.max_requests_per_user, "--max-requests-per-user"),
            max_caller_connections=_positive(
                args.max_caller_connections, "--max-caller-connections"
            ),
            max_caller_connections_per_address=_per_address(
                args.max_caller_connections_per_address,
                _positive(args.max_caller_connections, "--max-caller-connections"),
            ),
            tls_handshake_timeout=_seconds(args.tls_handshake_timeout, "--tls-handshake-timeout"),
            tls_handshake_grace=_seconds(args.tls_handshake_grace, "--tls-handshake-grace"),
        ),
        commands=CommandSettings(
            max_pending=_positive(args.max_pending_commands, "--max-pending-commands"),
            agent_return_grace=parse_duration(args.agent_return_grace).total_seconds(),
        ),
        store=StoreSettings(database=args.database or None),
        agent_image=args.agent_image,
        audit_retention=_retention(args.audit_retention, "--audit-retention"),
        command_retention=_retention(args.command_retention, "--command-retention"),
    )


def _token_ttl(value: str | None) -> timedelta | None:
    """``--max-api-token-ttl``: a duration within the bounds of a token's lifetime, or none."""
    if value is None:
        return None
    ttl = parse_duration(value)
    if not MIN_API_TOKEN_TTL <= ttl <= MAX_API_TOKEN_TTL:
        raise ConfigError(
            f"--max-api-token-ttl must be between {describe_duration(MIN_API_TOKEN_TTL)} and "
            f"{describe_duration(MAX_API_TOKEN_TTL)}, not {value}"
        )
    return ttl


def _retention(value: str, flag: str) -> timedelta:
    """A retention flag's duration: at least :data:`MIN_RETENTION`."""
    retention = parse_duration(value)
    if retention < MIN_RETENTION:
        raise ConfigError(
            f"{flag} must be at least {describe_duration(MIN_RETENTION)}, not {value}"
            " (it is how long records are kept before they are deleted)"
        )
    return retention


def _per_address(value: str | None, most: int) -> int | None:
    flag = "--max-caller-connections-per-address"
    if value is None:
        return None
    number = _positive(value, flag)
    if number > most:
        raise ConfigError(
            f"{flag} ({number}) cannot be more than --max-caller-connections ({most})"
        )
    return number


def _seconds(value: str, flag: str) -> float:
    """A flag's duration in seconds, more than none."""
    seconds = parse_duration(value).total_seconds()
    if seconds <= 0:
        raise ConfigError(f"{flag} must be longer than 0s, not {value}")
    return seconds


def _positive(value: str, flag: str) -> int:
    """A flag's whole number of at least 1."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise ConfigError(f"{flag} must be a whole number of at least 1, not {value!r}")
    return number


def _path(value: str | None) -> Path | None:
    return Path(value) if value else None


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``tunnel-server``."""
    args = build_parser().parse_args(argv)
    try:
        configure_logging(args.log_format, args.log_level)
        settings = settings_from_args(args)
        from tunnel_server.app import run_server

        run_main(run_server(settings), args.event_loop)
    except TunnelError as exc:
        print(f"tunnel-server: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
