"""``type: tofu`` specs and git sources (tunnel_commands.tofu, tunnel_commands.sources)."""

from __future__ import annotations

from typing import Any

import pytest

from tunnel_commands import (
    GitSource,
    KubernetesBackend,
    LocalBackend,
    SecretRef,
    TofuSpec,
    parse_command,
)

from .helpers import command, refused, round_trips

GIT = {"url": "https://git.example.com/infra.git", "ref": "main", "path": "envs/prod"}


def _spec(spec: dict[str, Any]) -> TofuSpec:
    parsed = parse_command(command("tofu", spec)).spec
    assert isinstance(parsed, TofuSpec)
    return parsed


def test_a_configuration_is_read_with_the_defaults() -> None:
    spec = _spec({"git": GIT})
    assert spec.source == GitSource("https://git.example.com/infra.git", "main", "envs/prod")
    assert spec.plan is False
    assert spec.variables == {}
    assert spec.backend == KubernetesBackend("web-app", None)


def test_every_field_is_read_and_round_trips() -> None:
    document = command(
        "tofu",
        {
            "git": GIT,
            "plan": True,
            "variables": {
                "region": "eu-west-1",
                "replicas": 3,
                "zones": ["a", "b"],
                "db_password": {"secretRef": {"namespace": "vault", "name": "db", "key": "pw"}},
            },
            "backend": {"namespace": "infra", "secretSuffix": "web"},
        },
    )
    spec = parse_command(document).spec
    assert isinstance(spec, TofuSpec)
    assert spec.plan is True
    assert spec.variables["db_password"] == SecretRef("vault", "db", "pw")
    assert spec.variables["zones"] == ["a", "b"]
    assert spec.backend == KubernetesBackend("web", "infra")
    round_trips(parse_command(document))


def test_the_local_backend_may_be_chosen() -> None:
    assert _spec({"git": GIT, "backend": {"local": True}}).backend == LocalBackend()
    round_trips(parse_command(command("tofu", {"git": GIT, "backend": {"local": True}})))


@pytest.mark.parametrize(
    "url",
    [
        "https://git.example.com/infra.git",
        "ssh://git@git.example.com/infra.git",
        "git@github.com:example/infra.git",
        "file:///srv/git/infra",
    ],
)
def test_git_urls_of_the_allowed_forms_are_accepted(url: str) -> None:
    assert _spec({"git": GIT | {"url": url}}).source.url == url


def test_the_path_defaults_to_the_repository_root() -> None:
    assert _spec({"git": {"url": GIT["url"], "ref": "v1"}}).source.path == "."


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({}, "spec.git: required"),
        ({"git": {"ref": "main"}}, "spec.git.url: required"),
        ({"git": GIT | {"url": "ext::sh -c id"}}, "spec.git.url: must be a https, http, ssh"),
        ({"git": GIT | {"url": "-uhttps://x"}}, "spec.git.url: must be a https, http, ssh"),
        (
            {"git": GIT | {"url": "ssh://-oProxyCommand=id/x.git"}},
            "spec.git.url: must not have a host or user starting with '-'",
        ),
        (
            {"git": GIT | {"url": "ssh://-oProxyCommand=id@host/x.git"}},
            "spec.git.url: must not have a host or user starting with '-'",
        ),
        ({"git": GIT | {"url": "a@-oProxyCommand:x"}}, "spec.git.url: must be a https, http, ssh"),
        (
            {"git": GIT | {"url": "https://user:token@git.example.com/x.git"}},
            "spec.git.url: must not hold a password",
        ),
        ({"git": GIT | {"url": "https:///x.git"}}, "spec.git.url: must name a host"),
        ({"git": GIT | {"ref": "--upload-pack=x"}}, "spec.git.ref: '--upload-pack=x' is not"),
        ({"git": GIT | {"ref": "a..b"}}, "spec.git.ref: 'a..b' is not a branch"),
        ({"git": GIT | {"ref": "main\n"}}, "spec.git.ref: 'main\\n' is not a branch"),
        ({"git": GIT | {"path": "a\n"}}, "spec.git.path: 'a\\n' is not a relative path"),
        ({"git": GIT | {"url": "git@host.example:x.git\n"}}, "spec.git.url: must be a https"),
        ({"git": GIT, "variables": {"x\n": "a"}}, "spec.variables.x\n: is not a variable name"),
        ({"git": GIT, "backend": {"namespace": "x\n"}}, "spec.backend.namespace: 'x\\n' is not"),
        ({"git": GIT | {"path": "../etc"}}, "spec.git.path: '../etc' is not a relative path"),
        ({"git": GIT | {"path": "/etc"}}, "spec.git.path: '/etc' is not a relative path"),
        ({"git": GIT | {"path": "a//b"}}, "spec.git.path: 'a//b' is not a relative path"),
        ({"git": GIT, "plan": "no"}, "spec.plan: must be true or false"),
        ({"git": GIT, "variables": []}, "spec.variables: must be a mapping"),
        ({"git": GIT, "variables": {"1x": "a"}}, "spec.variables.1x: is not a variable name"),
        (
            {"git": GIT, "variables": {"x": {"secretRef": "db"}}},
            "spec.variables.x.secretRef: must be a mapping of namespace, name and key",
        ),
        (
            {"git": GIT, "variables": {"x": {"outputRef": {"step": "a", "output": "b"}}}},
            "spec.variables.x.outputRef: outputRef is only allowed in the steps of a flow",
        ),
        ({"git": GIT, "backend": {"local": False}}, "spec.backend.local: must be true"),
        ({"git": GIT, "backend": {"local": True, "namespace": "x"}}, "spec.backend.namespace: un"),
        ({"git": GIT, "backend": {"namespace": "X"}}, "spec.backend.namespace: 'X' is not"),
        ({"git": GIT, "backend": {"bucket": "x"}}, "spec.backend.bucket: unknown field"),
        ({"git": GIT, "workspace": "x"}, "spec.workspace: unknown field"),
    ],
)
def test_tofu_errors_name_the_field(spec: dict[str, Any], message: str) -> None:
    assert str(refused(command("tofu", spec))).startswith(message)


def test_too_many_variables_are_refused() -> None:
    variables = {f"v{i}": "x" for i in range(501)}
    error = refused(command("tofu", {"git": GIT, "variables": variables}))
    assert str(error) == "spec.variables: must have at most 500 variables"
