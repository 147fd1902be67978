"""Command-line settings of tunnel-agent and tunnel-server: flags, environment, errors.

Every flag also reads its environment variable (so manifests can set it) and
the flag wins over the variable; values that cannot be used are refused with
a message that names the flag.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tunnel_agent import cli as agent_cli
from tunnel_agent.config import AgentSettings
from tunnel_agent.errors import AgentConfigError
from tunnel_cli import FlagError
from tunnel_server import cli as server_cli
from tunnel_server.config import ServerSettings
from tunnel_server.errors import ConfigError


@pytest.fixture(autouse=True)
def in_a_scratch_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No TUNNEL_* variable from this machine, relative paths under tmp_path, a few files."""
    for name in list(os.environ):
        if name.startswith(("TUNNEL_AGENT_", "TUNNEL_SERVER_")):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    files = {
        "base-ca.pem": "base CA\n",
        "env-ca.pem": "env CA\n",
        "flag-ca.pem": "flag CA\n",
        "env-token": "tbt_from_env_file\n",
        "flag-token": "  tbt_from_flag_file \n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)


@dataclass(frozen=True)
class FlagCase:
    """A flag, its variable, a value for each, and what each value makes of the settings.

    A ``flag_value`` of None is a switch (``store_true``): given, it is on;
    ``env_against_flag`` is then the variable's value the switch must beat.
    """

    flag: str
    env: str
    env_value: str
    flag_value: str | None
    read: Callable[[argparse.Namespace, Any], object]
    from_env: object
    from_flag: object
    env_against_flag: str | None = None

    def __str__(self) -> str:
        return self.flag

    def argv(self) -> list[str]:
        # --flag=value, so that a value starting with '-' is not taken for a flag.
        return [self.flag] if self.flag_value is None else [f"{self.flag}={self.flag_value}"]


def options_of(parser: argparse.ArgumentParser, command: str) -> set[str]:
    """The long options of a sub-command (argparse keeps them in private attributes)."""
    [subparsers] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    sub: argparse.ArgumentParser = subparsers.choices[command]
    return {
        option
        for action in sub._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    }


# ------------------------------------------------------------------ tunnel-agent

AGENT_BASE = {
    "--server": "https://base.example:8443",
    "--ca": "base-ca.pem",
    "--cluster": "base",
    "--credentials-dir": "creds-base",
}

AGENT_FLAGS = [
    FlagCase(
        "--server",
        "TUNNEL_AGENT_SERVER",
        "https://env.example:8443",
        "https://flag.example:8443/",
        lambda a, s: s.server_url,
        "https://env.example:8443",
        "https://flag.example:8443",
    ),
    FlagCase(
        "--ca",
        "TUNNEL_AGENT_CA",
        "env-ca.pem",
        "flag-ca.pem",
        lambda a, s: s.ca_pem,
        b"env CA\n",
        b"flag CA\n",
    ),
    FlagCase(
        "--cluster",
        "TUNNEL_AGENT_CLUSTER",
        "env-cluster",
        "flag-cluster",
        lambda a, s: s.cluster,
        "env-cluster",
        "flag-cluster",
    ),
    FlagCase(
        "--bootstrap-token",
        "TUNNEL_AGENT_BOOTSTRAP_TOKEN",
        "tbt_env",
        "tbt_flag",
        lambda a, s: s.bootstrap_token,
        "tbt_env",
        "tbt_flag",
    ),
    FlagCase(
        "--bootstrap-token-file",
        "TUNNEL_AGENT_BOOTSTRAP_TOKEN_FILE",
        "env-token",
        "flag-token",
        lambda a, s: s.bootstrap_token,
        "tbt_from_env_file",
        "tbt_from_flag_file",
    ),
    FlagCase(
        "--credentials-secret",
        "TUNNEL_AGENT_CREDENTIALS_SECRET",
        "ns-env/creds-env",
        "ns-flag/creds-flag",
        lambda a, s: s.credentials_secret,
        ("ns-env", "creds-env"),
        ("ns-flag", "creds-flag"),
    ),
    FlagCase(
        "--credentials-dir",
        "TUNNEL_AGENT_CREDENTIALS_DIR",
        "creds-env",
        "creds-flag",
        lambda a, s: s.credentials_dir,
        Path("creds-env"),
        Path("creds-flag"),
    ),
    FlagCase(
        "--kubeconfig",
        "TUNNEL_AGENT_KUBECONFIG",
        "env.kubeconfig",
        "flag.kubeconfig",
        lambda a, s: s.kubeconfig,
        Path("env.kubeconfig"),
        Path("flag.kubeconfig"),
    ),
    FlagCase(
        "--read-only",
        "TUNNEL_AGENT_READ_ONLY",
        "yes",
        None,
        lambda a, s: s.proxy.read_only,
        True,
        True,
        env_against_flag="no",
    ),
    FlagCase(
        "--namespaces",
        "TUNNEL_AGENT_NAMESPACES",
        "team-a,team-b",
        " team-c , ",
        lambda a, s: s.proxy.namespaces,
        frozenset({"team-a", "team-b"}),
        frozenset({"team-c"}),
    ),
    FlagCase(
        "--allow-secret-values",
        "TUNNEL_AGENT_ALLOW_SECRET_VALUES",
        "true",
        None,
        lambda a, s: s.proxy.allow_secret_values,
        True,
        True,
        env_against_flag="0",
    ),
    FlagCase(
        "--commands-concurrency",
        "TUNNEL_AGENT_COMMANDS_CONCURRENCY",
        "4",
        "8",
        lambda a, s: s.commands_concurrency,
        4,
        8,
    ),
    FlagCase(
        "--health-listen",
        "TUNNEL_AGENT_HEALTH_LISTEN",
        "0.0.0.0:9000",
        "127.0.0.1:9001",
        lambda a, s: s.health_listen,
        ("0.0.0.0", 9000),
        ("127.0.0.1", 9001),
    ),
    FlagCase(
        "--backoff-cap",
        "TUNNEL_AGENT_BACKOFF_CAP",
        "2m",
        "90s",
        lambda a, s: s.connect.backoff_cap,
        120.0,
        90.0,
    ),
    FlagCase(
        "--keepalive-interval",
        "TUNNEL_AGENT_KEEPALIVE_INTERVAL",
        "20s",
        "1m",
        lambda a, s: s.connect.keepalive.interval,
        20.0,
        60.0,
    ),
    FlagCase(
        "--keepalive-timeout",
        "TUNNEL_AGENT_KEEPALIVE_TIMEOUT",
        "10s",
        "250ms",
        lambda a, s: s.connect.keepalive.timeout,
        10.0,
        0.25,
    ),
    FlagCase(
        "--log-format",
        "TUNNEL_AGENT_LOG_FORMAT",
        "json",
        "text",
        lambda a, s: a.log_format,
        "json",
        "text",
    ),
    FlagCase(
        "--log-level",
        "TUNNEL_AGENT_LOG_LEVEL",
        "debug",
        "warning",
        lambda a, s: a.log_level,
        "debug",
        "warning",
    ),
]


def agent_args(argv: list[str]) -> argparse.Namespace:
    # The parser reads the environment when it is built, as the entry point does.
    return agent_cli.build_parser().parse_args(["run", *argv])


def agent_settings(**flags: str) -> AgentSettings:
    """Settings from AGENT_BASE's flags with ``flags`` (``credentials_dir=...``) on top."""
    options = dict(AGENT_BASE)
    options.update({"--" + name.replace("_", "-"): value for name, value in flags.items()})
    return agent_cli.settings_from_args(agent_args(as_argv(options)))


def as_argv(options: dict[str, str]) -> list[str]:
    return [f"{flag}={value}" for flag, value in options.items()]


def without(base: dict[str, str], flag: str) -> list[str]:
    return as_argv({name: value for name, value in base.items() if name != flag})


def test_every_agent_flag_is_covered_by_the_environment_table() -> None:
    assert options_of(agent_cli.build_parser(), "run") - {"--version"} == {
        case.flag for case in AGENT_FLAGS
    }


@pytest.mark.parametrize("case", AGENT_FLAGS, ids=str)
def test_agent_flag_reads_its_environment_variable(
    case: FlagCase, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(case.env, case.env_value)
    args = agent_args(without(AGENT_BASE, case.flag))
    assert case.read(args, agent_cli.settings_from_args(args)) == case.from_env


@pytest.mark.parametrize("case", AGENT_FLAGS, ids=str)
def test_agent_flag_wins_over_its_environment_variable(
    case: FlagCase, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(case.env, case.env_against_flag or case.env_value)
    args = agent_args([*without(AGENT_BASE, case.flag), *case.argv()])
    assert case.read(args, agent_cli.settings_from_args(args)) == case.from_flag


def test_agent_defaults_without_flags_or_environment() -> None:
    settings = agent_settings()
    assert settings.server_url == "https://base.example:8443"
    assert settings.bootstrap_token is None
    assert settings.credentials_secret is None
    assert settings.health_listen == ("127.0.0.1", 8081)
    assert settings.connect.backoff_cap == 300.0
    assert settings.connect.keepalive.interval == 15.0
    assert settings.connect.keepalive.timeout == 15.0
    assert settings.proxy.read_only is False
    assert settings.proxy.namespaces == frozenset()
    assert settings.proxy.allow_secret_values is False


def test_bootstrap_token_file_is_read_and_stripped() -> None:
    assert agent_settings(bootstrap_token_file="flag-token").bootstrap_token == "tbt_from_flag_file"


def test_bootstrap_token_flag_wins_over_the_token_file() -> None:
    settings = agent_settings(bootstrap_token="tbt_direct", bootstrap_token_file="flag-token")
    assert settings.bootstrap_token == "tbt_direct"


def test_empty_bootstrap_token_file_means_no_token(tmp_path: Path) -> None:
    (tmp_path / "empty-token").write_text("\n")
    assert agent_settings(bootstrap_token_file="empty-token").bootstrap_token is None


def test_empty_health_listen_in_the_environment_disables_the_health_endpoint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TUNNEL_AGENT_HEALTH_LISTEN", "")
    assert agent_settings().health_listen is None


@pytest.mark.parametrize(
    ("flag", "env"),
    [
        ("--server", "TUNNEL_AGENT_SERVER"),
        ("--ca", "TUNNEL_AGENT_CA"),
        ("--cluster", "TUNNEL_AGENT_CLUSTER"),
    ],
)
def test_missing_required_setting_names_its_flag_and_variable(flag: str, env: str) -> None:
    args = agent_args(without(AGENT_BASE, flag))
    with pytest.raises(AgentConfigError, match=f"give {flag} or {env}"):
        agent_cli.settings_from_args(args)


@pytest.mark.parametrize("value", ["tunnel-agent-credentials", "/creds", "ns/", "/"])
def test_credentials_secret_must_be_namespace_slash_name(value: str) -> None:
    with pytest.raises(AgentConfigError, match="--credentials-secret must be NAMESPACE/NAME"):
        agent_settings(credentials_secret=value)


@pytest.mark.parametrize("name", ["Prod-EU", "prod_eu", "-prod", "x" * 64])
def test_invalid_cluster_name_is_refused_with_the_rule(name: str) -> None:
    with pytest.raises(
        AgentConfigError, match=r"invalid cluster name .*lowercase a-z, 0-9 and '-'"
    ):
        agent_settings(cluster=name)


def test_unreadable_ca_bundle_names_the_file() -> None:
    with pytest.raises(AgentConfigError, match=r"cannot read the CA bundle from missing\.pem"):
        agent_settings(ca="missing.pem")


def test_unreadable_bootstrap_token_file_names_the_file() -> None:
    with pytest.raises(AgentConfigError, match="cannot read the bootstrap token from gone"):
        agent_settings(bootstrap_token_file="gone")


@pytest.mark.parametrize("value", ["localhost", "127.0.0.1:", "127.0.0.1:http"])
def test_health_listen_must_be_host_and_port(value: str) -> None:
    with pytest.raises(AgentConfigError, match="--health-listen must be HOST:PORT"):
        agent_settings(health_listen=value)


@pytest.mark.parametrize("flag", ["backoff_cap", "keepalive_interval", "keepalive_timeout"])
def test_bad_duration_is_refused_with_examples(flag: str) -> None:
    with pytest.raises(FlagError, match=r"'soon' is not a duration; use e\.g\. 30s"):
        agent_settings(**{flag: "soon"})


def test_outside_a_cluster_a_credentials_location_is_required(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agent_cli, "_SERVICE_ACCOUNT", tmp_path / "no-service-account")
    args = agent_args(without(AGENT_BASE, "--credentials-dir"))
    with pytest.raises(AgentConfigError, match="outside a cluster, give --credentials-dir"):
        agent_cli.settings_from_args(args)


def test_in_a_cluster_credentials_default_to_a_secret_in_the_pod_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "namespace").write_text("tunnel-agent\n")
    monkeypatch.setattr(agent_cli, "_SERVICE_ACCOUNT", account)
    settings = agent_cli.settings_from_args(agent_args(without(AGENT_BASE, "--credentials-dir")))
    assert settings.credentials_secret == ("tunnel-agent", "tunnel-agent-credentials")
    assert settings.credentials_dir is None


# ----------------------------------------------------------------- tunnel-server

SERVER_BASE = {
    "--state-dir": "state-base",
    "--listen": "127.0.0.1:9443",
    "--tls-cert": "base.crt",
    "--tls-key": "base.key",
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
    assert settings.tunnel.shutdown_grace == 30.0


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
        "--keepalive-interval",
        "--keepalive-timeout",
        "--shutdown-grace",
    ],
)
def test_server_bad_duration_is_refused_with_examples(flag: str) -> None:
    with pytest.raises(FlagError, match=r"'1 week' is not a duration; use e\.g\. 30s"):
        server_settings(flag, "1 week")
