"""Command-line settings of tunnel-agent: flags, environment, errors.

Every flag also reads its environment variable (so manifests can set it) and
the flag wins over the variable; values that cannot be used are refused with
a message that names the flag.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from tunnel_agent import cli as agent_cli
from tunnel_agent.config import AgentSettings
from tunnel_agent.errors import AgentConfigError
from tunnel_cli import FlagError

from ..cli_flags import FlagCase, as_argv, in_a_scratch_directory, options_of, without

__all__ = ["in_a_scratch_directory"]

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
        "--command-types",
        "TUNNEL_AGENT_COMMAND_TYPES",
        "query,manifests",
        " helm , ",
        lambda a, s: s.command_types,
        frozenset({"query", "manifests"}),
        frozenset({"helm"}),
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
        "--allow-file-git-sources",
        "TUNNEL_AGENT_ALLOW_FILE_GIT_SOURCES",
        "yes",
        None,
        lambda a, s: s.allow_file_git_sources,
        True,
        True,
        env_against_flag="false",
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
        "--run-image",
        "TUNNEL_AGENT_RUN_IMAGE",
        "registry.example.com/tunnel-agent:1",
        "registry.example.com/tunnel-agent:2",
        lambda a, s: s.run_image,
        "registry.example.com/tunnel-agent:1",
        "registry.example.com/tunnel-agent:2",
    ),
    FlagCase(
        "--gateway-listen",
        "TUNNEL_AGENT_GATEWAY_LISTEN",
        "0.0.0.0:8444",
        "127.0.0.1:9444",
        lambda a, s: s.gateway_listen,
        ("0.0.0.0", 8444),
        ("127.0.0.1", 9444),
    ),
    FlagCase(
        "--gateway-host",
        "TUNNEL_AGENT_GATEWAY_HOST",
        "10.1.2.3",
        "10.1.2.4",
        lambda a, s: s.gateway_host,
        "10.1.2.3",
        "10.1.2.4",
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
        "--keepalive-probe-timeout",
        "TUNNEL_AGENT_KEEPALIVE_PROBE_TIMEOUT",
        "3s",
        "750ms",
        lambda a, s: s.connect.keepalive.probe_timeout,
        3.0,
        0.75,
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
    FlagCase(
        "--event-loop",
        "TUNNEL_AGENT_EVENT_LOOP",
        "asyncio",
        "uvloop",
        lambda a, s: a.event_loop,
        "asyncio",
        "uvloop",
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
    assert settings.command_types == {"manifests", "helm", "tofu", "flow", "query"}
    assert settings.allow_file_git_sources is False


def test_bootstrap_token_file_is_read_and_stripped() -> None:
    assert agent_settings(bootstrap_token_file="flag-token").bootstrap_token == "tbt_from_flag_file"


def test_bootstrap_token_flag_wins_over_the_token_file() -> None:
    settings = agent_settings(bootstrap_token="tbt_direct", bootstrap_token_file="flag-token")
    assert settings.bootstrap_token == "tbt_direct"


def test_a_bootstrap_token_given_as_a_flag_is_used_with_a_warning() -> None:
    """ps shows a command line to everyone on the machine: the file or the variable do not."""
    args = agent_args([*as_argv(AGENT_BASE), "--bootstrap-token", "tbt_on_the_line"])
    assert agent_cli.settings_from_args(args).bootstrap_token == "tbt_on_the_line"
    assert agent_cli.command_line_warnings(args) == [
        "--bootstrap-token puts the token on the command line, where anyone on this machine "
        "can read it (ps, /proc); use --bootstrap-token-file or TUNNEL_AGENT_BOOTSTRAP_TOKEN "
        "instead"
    ]


def test_a_bootstrap_token_from_the_environment_or_a_file_brings_no_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    args = agent_args([*as_argv(AGENT_BASE), "--bootstrap-token-file", "flag-token"])
    assert agent_cli.command_line_warnings(args) == []
    monkeypatch.setenv("TUNNEL_AGENT_BOOTSTRAP_TOKEN", "tbt_env")
    args = agent_args(as_argv(AGENT_BASE))
    assert agent_cli.settings_from_args(args).bootstrap_token == "tbt_env"
    assert agent_cli.command_line_warnings(args) == []


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


@pytest.mark.parametrize("value", ["query,terraform", ",", ""])
def test_command_types_must_name_command_types(value: str) -> None:
    with pytest.raises(AgentConfigError, match="--command-types takes a list of manifests, helm"):
        agent_settings(command_types=value)


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


def test_a_gateway_on_every_address_tells_runs_this_hosts_own() -> None:
    """In a pod, the host name resolves to the pod's address, which runs' Job pods reach."""
    assert agent_cli._own_address("127.0.0.1") is None
    assert agent_cli._own_address("gateway.example") is None
    own = agent_cli._own_address("0.0.0.0")
    assert own is not None
    assert own != "0.0.0.0"
