"""The environment the manifests give the images is exactly what the commands read.

Every variable a Deployment sets must be one of the CLI's ``[env NAME]``
flags (tunnel_agent.cli / tunnel_server.cli), and the whole environment of
each Deployment, with its Secret and volume files in place, must make valid
settings: the images then start as the manifests expect.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.manifests.support import (
    PACKAGE_MANIFESTS,
    USER_MANIFESTS,
    VARIANTS,
    AgentValues,
    Object,
    built,
    containers,
    env_names,
    find,
    kustomize,
    render,
)
from tunnel_agent import cli as agent_cli
from tunnel_server import cli as server_cli

ENV_IN_HELP = re.compile(r"\[env ([A-Z0-9_]+)\]")


def cli_env_names(parser: argparse.ArgumentParser) -> set[str]:
    """The variables a parser's flags read, from their help ("[env NAME]"), subcommands too."""
    names = set()
    for action in parser._actions:
        names.update(ENV_IN_HELP.findall(action.help or ""))
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                names |= cli_env_names(subparser)
    return names


def _agent_builds() -> list[list[Object]]:
    found = [render(variant, AgentValues().for_variant(variant)) for variant in VARIANTS]
    found += [built(USER_MANIFESTS / "agent" / variant) for variant in VARIANTS]
    return found


def _server_builds(tmp_path: Path) -> list[list[Object]]:
    """The server as shipped, and with the optional tls.yaml patch."""
    shutil.copytree(PACKAGE_MANIFESTS, tmp_path / "tunnel_server" / "manifests")
    shutil.copytree(USER_MANIFESTS, tmp_path / "manifests")
    kustomization = tmp_path / "manifests" / "server" / "kustomization.yaml"
    kustomization.write_text(
        kustomization.read_text().replace("  # - path: tls.yaml", "  - path: tls.yaml")
    )
    return [built(USER_MANIFESTS / "server"), kustomize(tmp_path / "manifests" / "server")]


def test_the_cli_names_are_found() -> None:
    """The help-text scan sees the variables the CLIs are known to read."""
    agent = cli_env_names(agent_cli.build_parser())
    server = cli_env_names(server_cli.build_parser())
    assert {"TUNNEL_AGENT_SERVER", "TUNNEL_AGENT_HEALTH_LISTEN", "TUNNEL_AGENT_READ_ONLY"} <= agent
    assert {"TUNNEL_SERVER_STATE_DIR", "TUNNEL_SERVER_LISTEN"} <= server
    assert all(name.startswith("TUNNEL_AGENT_") for name in agent)
    assert all(name.startswith("TUNNEL_SERVER_") for name in server)


def test_every_agent_variable_is_a_tunnel_agent_flag() -> None:
    known = cli_env_names(agent_cli.build_parser())
    for objects in _agent_builds():
        used = set(env_names(objects))
        assert used, "no environment found"
        assert used <= known, sorted(used - known)


def test_every_server_variable_is_a_tunnel_server_flag(tmp_path: Path) -> None:
    known = cli_env_names(server_cli.build_parser())
    for objects in _server_builds(tmp_path):
        used = set(env_names(objects))
        assert used, "no environment found"
        assert used <= known, sorted(used - known)


def _environment(objects: list[Object], name: str, files: Path) -> dict[str, str]:
    """The container's environment, Secret references resolved and mounted paths under ``files``.

    Secret volumes of the manifest's Secrets are written out under ``files``
    (as the kubelet would mount them) and paths in the environment point there.
    """
    deployment = find(objects, "Deployment", name)
    pod = deployment["spec"]["template"]["spec"]
    [container] = containers(deployment)
    secrets = {obj["metadata"]["name"]: obj for obj in objects if obj["kind"] == "Secret"}
    mounts: dict[str, Path] = {}
    for volume in pod["volumes"]:
        if "secret" not in volume:
            continue
        [mount] = [item for item in container["volumeMounts"] if item["name"] == volume["name"]]
        target = files / volume["name"]
        target.mkdir()
        # A Secret the user creates apart (the server's own certificate) stays empty.
        secret = secrets.get(volume["secret"]["secretName"], {"stringData": {}})
        for key, value in secret["stringData"].items():
            (target / key).write_text(value)
        mounts[mount["mountPath"]] = target
    environment = {}
    for variable in container["env"]:
        if "valueFrom" in variable:
            reference = variable["valueFrom"]["secretKeyRef"]
            value = secrets[reference["name"]]["stringData"][reference["key"]]
        else:
            value = variable["value"]
            for mount_path, target in mounts.items():
                if value.startswith(mount_path + "/"):
                    value = str(target) + value[len(mount_path) :]
        environment[variable["name"]] = value
    return environment


def _clear(monkeypatch: pytest.MonkeyPatch, prefix: str) -> None:
    for name in list(os.environ):
        if name.startswith(prefix):
            monkeypatch.delenv(name)


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_agent_deployment_environment_makes_the_intended_settings(
    variant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = AgentValues().for_variant(variant)
    objects = render(variant, values)
    _clear(monkeypatch, "TUNNEL_AGENT_")
    for name, value in _environment(objects, "tunnel-agent", tmp_path).items():
        monkeypatch.setenv(name, value)
    settings = agent_cli.settings_from_args(agent_cli.build_parser().parse_args(["run"]))
    assert settings.server_url == values.server_url
    assert settings.cluster == values.cluster
    assert settings.ca_pem == values.ca_pem.encode()
    assert settings.bootstrap_token == values.bootstrap_token
    assert settings.credentials_secret == (values.namespace, "tunnel-agent-credentials")
    assert settings.credentials_dir is None
    assert settings.kubeconfig is None  # in-cluster
    assert settings.health_listen == ("0.0.0.0", 8081)
    assert settings.proxy.read_only is (variant == "read-only")
    assert settings.proxy.namespaces == frozenset(values.namespaces)
    assert settings.proxy.allow_secret_values is False


@pytest.mark.parametrize("tls", [False, True])
def test_the_server_deployment_environment_makes_the_intended_settings(
    tls: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = _server_builds(tmp_path / "build")[1 if tls else 0]
    _clear(monkeypatch, "TUNNEL_SERVER_")
    files = tmp_path / "files"
    files.mkdir()
    environment = _environment(objects, "tunnel-server", files)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    settings: Any = server_cli.settings_from_args(server_cli.build_parser().parse_args(["serve"]))
    assert str(settings.state_dir) == "/var/lib/tunnel-server"
    assert (settings.listen.host, settings.listen.port) == ("0.0.0.0", 8443)
    assert settings.listen.public_url == "https://tunnel.example.com"
    assert settings.agent_image == "ghcr.io/example/tunnel-agent:0.1.0"
    if tls:
        assert settings.tls.cert_file is not None
        assert settings.tls.cert_file.name == "tls.crt"
        assert settings.tls.key_file is not None
        assert settings.tls.ca_file is not None
    else:
        assert settings.tls.cert_file is None


def test_the_agent_image_the_server_names_is_the_one_the_agent_manifests_use() -> None:
    """The server's TUNNEL_SERVER_AGENT_IMAGE, the packaged default and values.yaml agree."""
    server = find(built(USER_MANIFESTS / "server"), "Deployment", "tunnel-server")
    [container] = containers(server)
    env = {variable["name"]: variable.get("value") for variable in container["env"]}
    [agent] = containers(
        find(built(PACKAGE_MANIFESTS / "agent" / "overlays" / "full"), "Deployment", "tunnel-agent")
    )
    assert env["TUNNEL_SERVER_AGENT_IMAGE"] == agent["image"]
    for variant in VARIANTS:
        [user] = containers(
            find(built(USER_MANIFESTS / "agent" / variant), "Deployment", "tunnel-agent")
        )
        assert user["image"] == agent["image"]
