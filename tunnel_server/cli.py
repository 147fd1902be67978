"""The ``tunnel-server`` command: ``tunnel-server serve``."""

from __future__ import annotations

import argparse
import logging
import re
import socket
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
    ReplicaSettings,
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
        "--replica-name",
        env + "REPLICA_NAME",
        default=None,
        help="this replica's name among those sharing --database (default: the host name)",
    )
    env_flag(
        serve,
        "--peer-listen",
        env + "PEER_LISTEN",
        default="0.0.0.0:8444",
        help="HOST:PORT of the internal port other replicas forward requests to "
        "(with --database; mTLS between replicas only)",
    )
    env_flag(
        serve,
        "--advertise-address",
        env + "ADVERTISE_ADDRESS",
        default=None,
        help="HOST:PORT other replicas reach the internal port at "
        "(default: --peer-listen's host, or this host's name)",
    )
    env_flag(
        serve,
        "--replica-lease",
        env + "REPLICA_LEASE",
        default="10s",
        help="how long a replica's hold on its agents' sessions lasts without a heartbeat",
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
        "--ca-cert",
        env + "CA_CERT",
        help="the tunnel CA's certificate (PEM), shared by every replica "
        "(default: ca.crt in --state-dir, created on first start)",
    )
    env_flag(serve, "--ca-key", env + "CA_KEY", help="the key of --ca-cert (PEM)")
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
    create_ca = commands.add_parser(
        "create-ca",
        help="create the tunnel CA (ca.crt, ca.key) that several replicas share (--ca-cert)",
    )
    create_ca.add_argument("--out", required=True, help="directory to write ca.crt and ca.key to")
    move = commands.add_parser(
        "migrate-store",
        help="move a single server's SQLite state to PostgreSQL (again: adds what is new)",
    )
    env_flag(
        move,
        "--from",
        env + "STATE_DIR",
        default="./state",
        help="the state directory whose state.db to move",
    )
    env_flag(
        move,
        "--to",
        env + "DATABASE",
        default=None,
        help="postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE to move it to",
    )
    for flag, variable, default, text in (
        ("--log-level", "LOG_LEVEL", "info", "log level"),
        ("--log-format", "LOG_FORMAT", "text", "log format: text or json"),
    ):
        env_flag(move, flag, env + variable, default=default, help=text)
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
            cert_file=_path(args.tls_cert),
            key_file=_path(args.tls_key),
            ca_file=_path(args.tls_ca),
            ca_cert_file=_path(args.ca_cert),
            ca_key_file=_path(args.ca_key),
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
        replica=_replica_settings(args),
        agent_image=args.agent_image,
        audit_retention=_retention(args.audit_retention, "--audit-retention"),
        command_retention=_retention(args.command_retention, "--command-retention"),
    )


def _replica_settings(args: argparse.Namespace) -> ReplicaSettings:
    """The replica flags; the name defaults to the host's (a pod's name), made a DNS label."""
    host, _, port_text = str(args.peer_listen).rpartition(":")
    if not host or not port_text.isdigit():
        raise ConfigError(f"--peer-listen must be HOST:PORT, not {args.peer_listen!r}")
    name = args.replica_name or _label(socket.gethostname())
    if args.advertise_address is not None:
        advertised_host, _, advertised_port = str(args.advertise_address).rpartition(":")
        if not advertised_host or not advertised_port.isdigit():
            raise ConfigError(
                f"--advertise-address must be HOST:PORT, not {args.advertise_address!r}"
            )
    lease = parse_duration(args.replica_lease).total_seconds()
    return ReplicaSettings(
        name=name,
        peer_host=host.strip("[]"),
        peer_port=int(port_text),
        advertise=args.advertise_address,
        lease=lease,
        heartbeat=lease / 5,
    )


def _label(host: str) -> str:
    """A host name as a replica name: its first label, lower case, other characters as '-'."""
    label = re.sub(r"[^a-z0-9-]", "-", host.split(".", 1)[0].lower()).strip("-")[:63]
    return label.strip("-") or "replica"


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
        configure_logging(getattr(args, "log_format", "text"), getattr(args, "log_level", "info"))
        if args.command == "migrate-store":
            return _migrate_store(args)
        if args.command == "create-ca":
            return _create_ca(Path(args.out))
        settings = settings_from_args(args)
        from tunnel_server.app import run_server

        run_main(run_server(settings), args.event_loop)
    except TunnelError as exc:
        print(f"tunnel-server: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def _create_ca(out: Path) -> int:
    """``create-ca``: a new CA in ``out``, refusing to overwrite one."""
    from tunnel_pki.ca import CertificateAuthority
    from tunnel_pki.files import write_private_file

    cert, key = out / "ca.crt", out / "ca.key"
    if cert.exists() or key.exists():
        raise ConfigError(f"{out} already holds a CA: remove ca.crt and ca.key first")
    try:
        out.mkdir(parents=True, exist_ok=True, mode=0o700)
        ca = CertificateAuthority.create()
        write_private_file(key, ca.key_pem)
        cert.write_bytes(ca.cert_pem)
    except OSError as exc:
        raise ConfigError(f"cannot write the CA to {out}: {exc.strerror}") from exc
    print(f"created {cert} and {key} (mode 0600); store them in a Secret, keep a backup")
    return 0


def _migrate_store(args: argparse.Namespace) -> int:
    """``migrate-store``: move STATE_DIR/state.db into the database, and say what moved."""
    import asyncio

    from tunnel_server.store.migrate import describe, move_sqlite_to_postgres

    if not args.to:
        raise ConfigError("migrate-store needs --to postgresql://... (or TUNNEL_SERVER_DATABASE)")
    StoreSettings(database=args.to)  # the same check as serve's --database
    moved = asyncio.run(move_sqlite_to_postgres(Path(args.__dict__["from"]) / "state.db", args.to))
    print(describe(moved))
    print("verified: every row of the state directory is in the database")
    return 0


if __name__ == "__main__":
    sys.exit(main())
