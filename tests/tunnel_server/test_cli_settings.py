"""Command-line settings of tunnel-server: flags, environment, errors.

Every flag also reads its environment variable (so manifests can set it) and
the flag wins over the variable; values that cannot be used are refused with
a message that names the flag.
"""

from __future__ import annotations

import argparse
from datetime import timedelta
from pathlib import Path

import pytest

from tunnel_cli import FlagError
from tunnel_server import cli as server_cli
from tunnel_server.config import ServerSettings
from tunnel_server.errors import ConfigError

from ..cli_flags import FlagCase, in_a_scratch_directory, options_of, without

__all__ = ["in_a_scratch_directory"]

# ----------------------------------------------------------------- tunnel-server

SERVER_BASE = {
    "--state-dir": "state-base",
    "--listen": "127.0.0.1:9443",
    "--tls-cert": "base.crt",
    "--tls-key": "base.key",
    "--ca-cert": "base-ca.crt",
    "--ca-key": "base-ca.key",
}

SERVER_FLAGS = [
    FlagCase(
        "--state-dir",
        "TUNNEL_SERVER_STATE_DIR",
        "state-env",
        "state-flag",
        lambda a, s: s.state_dir,
        Path("state-env"),
        Path("state-flag"),
    ),
    FlagCase(
        "--database",
        "TUNNEL_SERVER_DATABASE",
        "postgresql://tunnel@db-env/tunnel",
        "postgresql://tunnel@db-flag:5433/tunnel",
        lambda a, s: s.store.database,
        "postgresql://tunnel@db-env/tunnel",
        "postgresql://tunnel@db-flag:5433/tunnel",
    ),
    FlagCase(
        "--replica-name",
        "TUNNEL_SERVER_REPLICA_NAME",
        "replica-env",
        "replica-flag",
        lambda a, s: s.replica.name,
        "replica-env",
        "replica-flag",
    ),
    FlagCase(
        "--peer-listen",
        "TUNNEL_SERVER_PEER_LISTEN",
        "10.0.0.1:7444",
        "10.0.0.2:8444",
        lambda a, s: (s.replica.peer_host, s.replica.peer_port),
        ("10.0.0.1", 7444),
        ("10.0.0.2", 8444),
    ),
    FlagCase(
        "--advertise-address",
        "TUNNEL_SERVER_ADVERTISE_ADDRESS",
        "10.1.0.1:8444",
        "pod-b.example:8444",
        lambda a, s: s.replica.advertise,
        "10.1.0.1:8444",
        "pod-b.example:8444",
    ),
    FlagCase(
        "--replica-lease",
        "TUNNEL_SERVER_REPLICA_LEASE",
        "20s",
        "1m",
        lambda a, s: (s.replica.lease, s.replica.heartbeat),
        (20.0, 4.0),
        (60.0, 12.0),
    ),
    FlagCase(
        "--ca-cert",
        "TUNNEL_SERVER_CA_CERT",
        "env-ca.crt",
        "flag-ca.crt",
        lambda a, s: s.tls.ca_cert_file,
        Path("env-ca.crt"),
        Path("flag-ca.crt"),
    ),
    FlagCase(
        "--ca-key",
        "TUNNEL_SERVER_CA_KEY",
        "env-ca.key",
        "flag-ca.key",
        lambda a, s: s.tls.ca_key_file,
        Path("env-ca.key"),
        Path("flag-ca.key"),
    ),
    FlagCase(
        "--listen",
        "TUNNEL_SERVER_LISTEN",
        "127.0.0.2:7000",
        "127.0.0.3:7001",
        lambda a, s: (s.listen.host, s.listen.port),
        ("127.0.0.2", 7000),
        ("127.0.0.3", 7001),
    ),
    FlagCase(
        "--public-url",
        "TUNNEL_SERVER_PUBLIC_URL",
        "https://env.example",
        "https://flag.example:8443",
        lambda a, s: s.listen.public_url,
        "https://env.example",
        "https://flag.example:8443",
    ),
    FlagCase(
        "--tls-cert",
        "TUNNEL_SERVER_TLS_CERT",
        "env.crt",
        "flag.crt",
        lambda a, s: s.tls.cert_file,
        Path("env.crt"),
        Path("flag.crt"),
    ),
    FlagCase(
        "--tls-key",
        "TUNNEL_SERVER_TLS_KEY",
        "env.key",
        "flag.key",
        lambda a, s: s.tls.key_file,
        Path("env.key"),
        Path("flag.key"),
    ),
    FlagCase(
        "--tls-ca",
        "TUNNEL_SERVER_TLS_CA",
        "env-ca.pem",
        "flag-ca.pem",
        lambda a, s: s.tls.ca_file,
        Path("env-ca.pem"),
        Path("flag-ca.pem"),
    ),
    FlagCase(
        "--bootstrap-token-ttl",
        "TUNNEL_SERVER_BOOTSTRAP_TOKEN_TTL",
        "90m",
        "2d",
        lambda a, s: s.identity.bootstrap_token_ttl,
        timedelta(minutes=90),
        timedelta(days=2),
    ),
    FlagCase(
        "--max-api-token-ttl",
        "TUNNEL_SERVER_MAX_API_TOKEN_TTL",
        "30d",
        "8h",
        lambda a, s: s.identity.max_api_token_ttl,
        timedelta(days=30),
        timedelta(hours=8),
    ),
    FlagCase(
        "--client-cert-lifetime",
        "TUNNEL_SERVER_CLIENT_CERT_LIFETIME",
        "7d",
        "12h",
        lambda a, s: s.identity.client_cert_lifetime,
        timedelta(days=7),
        timedelta(hours=12),
    ),
    FlagCase(
        "--keepalive-interval",
        "TUNNEL_SERVER_KEEPALIVE_INTERVAL",
        "20s",
        "1m",
        lambda a, s: s.tunnel.keepalive.interval,
        20.0,
        60.0,
    ),
    FlagCase(
        "--keepalive-timeout",
        "TUNNEL_SERVER_KEEPALIVE_TIMEOUT",
        "10s",
        "500ms",
        lambda a, s: s.tunnel.keepalive.timeout,
        10.0,
        0.5,
    ),
    FlagCase(
        "--keepalive-probe-timeout",
        "TUNNEL_SERVER_KEEPALIVE_PROBE_TIMEOUT",
        "3s",
        "750ms",
        lambda a, s: s.tunnel.keepalive.probe_timeout,
        3.0,
        0.75,
    ),
    FlagCase(
        "--shutdown-grace",
        "TUNNEL_SERVER_SHUTDOWN_GRACE",
        "5s",
        "250ms",
        lambda a, s: s.tunnel.shutdown_grace,
        5.0,
        0.25,
    ),
    FlagCase(
        "--audit-retention",
        "TUNNEL_SERVER_AUDIT_RETENTION",
        "30d",
        "12h",
        lambda a, s: s.audit_retention.total_seconds(),
        30 * 86400.0,
        12 * 3600.0,
    ),
    FlagCase(
        "--command-retention",
        "TUNNEL_SERVER_COMMAND_RETENTION",
        "7d",
        "2h",
        lambda a, s: s.command_retention.total_seconds(),
        7 * 86400.0,
        2 * 3600.0,
    ),
    FlagCase(
        "--max-requests-per-user",
        "TUNNEL_SERVER_MAX_REQUESTS_PER_USER",
        "64",
        "8",
        lambda a, s: s.tunnel.max_requests_per_user,
        64,
        8,
    ),
    FlagCase(
        "--max-caller-connections",
        "TUNNEL_SERVER_MAX_CALLER_CONNECTIONS",
        "1000",
        "10",
        lambda a, s: s.tunnel.max_caller_connections,
        1000,
        10,
    ),
    FlagCase(
        "--max-caller-connections-per-address",
        "TUNNEL_SERVER_MAX_CALLER_CONNECTIONS_PER_ADDRESS",
        "500",
        "16",
        lambda a, s: s.tunnel.max_caller_connections_per_address,
        500,
        16,
    ),
    FlagCase(
        "--tls-handshake-timeout",
        "TUNNEL_SERVER_TLS_HANDSHAKE_TIMEOUT",
        "30s",
        "5s",
        lambda a, s: s.tunnel.tls_handshake_timeout,
        30.0,
        5.0,
    ),
    FlagCase(
        "--tls-handshake-grace",
        "TUNNEL_SERVER_TLS_HANDSHAKE_GRACE",
        "5s",
        "500ms",
        lambda a, s: s.tunnel.tls_handshake_grace,
        5.0,
        0.5,
    ),
    FlagCase(
        "--max-pending-commands",
        "TUNNEL_SERVER_MAX_PENDING_COMMANDS",
        "500",
        "20",
        lambda a, s: s.commands.max_pending,
        500,
        20,
    ),
    FlagCase(
        "--agent-return-grace",
        "TUNNEL_SERVER_AGENT_RETURN_GRACE",
        "15m",
        "90s",
        lambda a, s: s.commands.agent_return_grace,
        900.0,
        90.0,
    ),
    FlagCase(
        "--agent-image",
        "TUNNEL_SERVER_AGENT_IMAGE",
        "registry.example/agent:env",
        "registry.example/agent:flag",
        lambda a, s: s.agent_image,
        "registry.example/agent:env",
        "registry.example/agent:flag",
    ),
    FlagCase(
        "--log-format",
        "TUNNEL_SERVER_LOG_FORMAT",
        "json",
        "text",
        lambda a, s: a.log_format,
        "json",
        "text",
    ),
    FlagCase(
        "--log-level",
        "TUNNEL_SERVER_LOG_LEVEL",
        "debug",
        "error",
        lambda a, s: a.log_level,
        "debug",
        "error",
    ),
    FlagCase(
        "--event-loop",
        "TUNNEL_SERVER_EVENT_LOOP",
        "asyncio",
        "uvloop",
        lambda a, s: a.event_loop,
        "asyncio",
        "uvloop",
    ),
]


def server_args(argv: list[str]) -> argparse.Namespace:
    return server_cli.build_parser().parse_args(["serve", *argv])


def server_settings(*argv: str) -> ServerSettings:
    return server_cli.settings_from_args(server_args(list(argv)))


def test_every_server_flag_is_covered_by_the_environment_table() -> None:
    assert options_of(server_cli.build_parser(), "serve") == {case.flag for case in SERVER_FLAGS}


@pytest.mark.parametrize("case", SERVER_FLAGS, ids=str)
def test_server_flag_reads_its_environment_variable(
    case: FlagCase, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(case.env, case.env_value)
    args = server_args(without(SERVER_BASE, case.flag))
    assert case.read(args, server_cli.settings_from_args(args)) == case.from_env


@pytest.mark.parametrize("case", SERVER_FLAGS, ids=str)
def test_server_flag_wins_over_its_environment_variable(
    case: FlagCase, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(case.env, case.env_against_flag or case.env_value)
    args = server_args([*without(SERVER_BASE, case.flag), *case.argv()])
    assert case.read(args, server_cli.settings_from_args(args)) == case.from_flag


def test_server_defaults_without_flags_or_environment() -> None:
    settings = server_settings()
    assert settings.state_dir == Path("state")
    assert (settings.listen.host, settings.listen.port) == ("0.0.0.0", 8443)
    assert settings.listen.public_url == "https://localhost:8443"
    assert settings.tls.cert_file is None
    assert settings.identity.bootstrap_token_ttl == timedelta(hours=24)
    assert settings.identity.client_cert_lifetime == timedelta(days=30)
    assert settings.identity.max_api_token_ttl is None  # tokens live until revoked
    assert settings.tunnel.shutdown_grace == 30.0
    assert settings.commands.max_pending == 10_000
    assert settings.commands.agent_return_grace == 360.0
    assert settings.tunnel.max_requests_per_user == 1024
    assert settings.tunnel.max_caller_connections == 4096
    assert settings.audit_retention == timedelta(days=90)
    assert settings.command_retention == timedelta(days=30)


@pytest.mark.parametrize(
    ("listen", "host", "port", "public_url"),
    [
        ("127.0.0.1:9443", "127.0.0.1", 9443, "https://127.0.0.1:9443"),
        ("0.0.0.0:8443", "0.0.0.0", 8443, "https://localhost:8443"),
        ("[::]:8443", "::", 8443, "https://localhost:8443"),
        ("[::1]:9443", "::1", 9443, "https://[::1]:9443"),
        ("tunnel.example.com:443", "tunnel.example.com", 443, "https://tunnel.example.com:443"),
    ],
)
def test_listen_gives_host_port_and_default_public_url(
    listen: str, host: str, port: int, public_url: str
) -> None:
    settings = server_settings("--listen", listen)
    assert (settings.listen.host, settings.listen.port) == (host, port)
    assert settings.listen.public_url == public_url


def test_public_url_overrides_the_one_derived_from_listen() -> None:
    settings = server_settings("--listen", "0.0.0.0:8443", "--public-url", "https://tunnel.example")
    assert settings.listen.public_url == "https://tunnel.example"
    assert settings.listen.public_host == "tunnel.example"


@pytest.mark.parametrize("listen", ["8443", ":8443", "127.0.0.1:", "127.0.0.1:https"])
def test_listen_without_host_and_port_is_refused(listen: str) -> None:
    with pytest.raises(ConfigError, match="--listen must be HOST:PORT"):
        server_settings("--listen", listen)


def test_listen_port_out_of_range_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"port 70000 is outside 0\.\.65535"):
        server_settings("--listen", "127.0.0.1:70000")


@pytest.mark.parametrize("url", ["http://tunnel.example", "tunnel.example:8443", "https://"])
def test_public_url_must_be_https_with_a_host(url: str) -> None:
    with pytest.raises(ConfigError, match="public URL must be https://HOST"):
        server_settings("--public-url", url)


@pytest.mark.parametrize("flag", ["--tls-cert", "--tls-key"])
def test_tls_cert_and_key_go_together(flag: str) -> None:
    with pytest.raises(ConfigError, match="--tls-cert and --tls-key go together"):
        server_settings(flag, "server.pem")


@pytest.mark.parametrize(
    "flag",
    [
        "--bootstrap-token-ttl",
        "--client-cert-lifetime",
        "--max-api-token-ttl",
        "--keepalive-interval",
        "--keepalive-timeout",
        "--keepalive-probe-timeout",
        "--shutdown-grace",
        "--audit-retention",
        "--command-retention",
        "--agent-return-grace",
        "--tls-handshake-timeout",
        "--tls-handshake-grace",
    ],
)
def test_server_bad_duration_is_refused_with_examples(flag: str) -> None:
    with pytest.raises(FlagError, match=r"'1 week' is not a duration; use e\.g\. 30s"):
        server_settings(flag, "1 week")


@pytest.mark.parametrize("value", ["30s", "3651d"])
def test_a_maximum_token_lifetime_out_of_bounds_is_refused(value: str) -> None:
    with pytest.raises(
        ConfigError, match=f"--max-api-token-ttl must be between 1m and 3650d, not {value}"
    ):
        server_settings("--max-api-token-ttl", value)


@pytest.mark.parametrize("flag", ["--audit-retention", "--command-retention"])
@pytest.mark.parametrize("value", ["0", "59m"])
def test_a_retention_under_an_hour_is_refused(flag: str, value: str) -> None:
    # A retention of minutes would delete the records the hour they are made.
    with pytest.raises(ConfigError, match=f"{flag} must be at least 1h, not {value}"):
        server_settings(flag, value)


@pytest.mark.parametrize("value", ["99999999999d", "9" * 400, "\u0663h"])
def test_a_duration_too_long_or_not_in_ascii_digits_is_refused(value: str) -> None:
    with pytest.raises(FlagError):
        server_settings("--max-api-token-ttl", value)


@pytest.mark.parametrize(
    "flag", ["--max-pending-commands", "--max-requests-per-user", "--max-caller-connections"]
)
@pytest.mark.parametrize("value", ["0", "-5", "many", "1.5"])
def test_counts_must_be_positive_whole_numbers(flag: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"{flag} must be a whole number"):
        server_settings(flag, value)


@pytest.mark.parametrize("flag", ["--tls-handshake-timeout", "--tls-handshake-grace"])
def test_a_handshake_duration_of_nothing_is_refused(flag: str) -> None:
    with pytest.raises(ConfigError, match=f"{flag} must be longer than 0s, not 0s"):
        server_settings(flag, "0s")


def test_without_a_limit_per_address_the_server_takes_half_of_its_limit() -> None:
    assert server_settings().tunnel.max_caller_connections_per_address is None


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_a_limit_per_address_that_is_no_whole_number_of_at_least_1_is_refused(value: str) -> None:
    with pytest.raises(ConfigError, match="--max-caller-connections-per-address must be a whole"):
        server_settings("--max-caller-connections-per-address", value)


def test_a_limit_per_address_above_the_servers_is_refused() -> None:
    with pytest.raises(
        ConfigError,
        match=r"--max-caller-connections-per-address \(50\) cannot be more than "
        r"--max-caller-connections \(10\)",
    ):
        server_settings(
            "--max-caller-connections", "10", "--max-caller-connections-per-address", "50"
        )
