"""``type: helm`` specs (tunnel_commands.helm)."""

from __future__ import annotations

from typing import Any

import pytest

from tunnel_commands import (
    GitChart,
    GitSource,
    HelmSpec,
    OciChart,
    RepoChart,
    SecretRef,
    parse_command,
)

from .helpers import command, refused, round_trips

REPO = {"repo": "https://charts.example.com", "name": "web", "version": "1.2.3"}


def _spec(spec: dict[str, Any]) -> HelmSpec:
    parsed = parse_command(command("helm", spec)).spec
    assert isinstance(parsed, HelmSpec)
    return parsed


def test_a_repository_chart_is_read_with_the_defaults() -> None:
    spec = _spec({"namespace": "web", "chart": REPO})
    assert spec.release == "web-app"
    assert spec.chart == RepoChart("https://charts.example.com", "web", "1.2.3")
    assert spec.values == {}
    assert (spec.wait, spec.atomic, spec.create_namespace, spec.timeout) == (
        False,
        False,
        False,
        None,
    )


def test_every_field_is_read_and_round_trips() -> None:
    document = command(
        "helm",
        {
            "release": "web",
            "namespace": "web",
            "chart": {"oci": "oci://registry.example.com/charts/web", "version": "~1.2"},
            "values": {"replicas": 2, "db": {"password": {"secretRef": {
                "namespace": "vault", "name": "db", "key": "password"}}}},
            "wait": True,
            "atomic": True,
            "timeout": "5m",
            "createNamespace": True,
        },
    )  # fmt: skip
    spec = parse_command(document).spec
    assert isinstance(spec, HelmSpec)
    assert spec.release == "web"
    assert spec.chart == OciChart("oci://registry.example.com/charts/web", "~1.2")
    assert spec.values == {
        "replicas": 2,
        "db": {"password": SecretRef("vault", "db", "password")},
    }
    assert (spec.wait, spec.atomic, spec.create_namespace, spec.timeout) == (True, True, True, 300)
    round_trips(parse_command(document))


def test_a_git_chart_is_read() -> None:
    chart = {"git": {"url": "https://git.example.com/charts.git", "ref": "v1", "path": "web"}}
    spec = _spec({"namespace": "web", "chart": chart})
    assert spec.chart == GitChart(GitSource("https://git.example.com/charts.git", "v1", "web"))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"chart": REPO}, "spec.namespace: required"),
        ({"namespace": "web"}, "spec.chart: required"),
        ({"namespace": "web", "chart": {}}, "spec.chart: needs one of repo, oci, git"),
        (
            {"namespace": "web", "chart": REPO | {"oci": "oci://r.example.com/c"}},
            "spec.chart: must have only one of repo, oci, git",
        ),
        ({"namespace": "web", "chart": {"repo": REPO["repo"]}}, "spec.chart.name: required"),
        (
            {"namespace": "web", "chart": REPO | {"repo": "ftp://x.example.com"}},
            "spec.chart.repo: must be an http(s) URL without a password",
        ),
        (
            {"namespace": "web", "chart": REPO | {"repo": "https://u:p@x.example.com"}},
            "spec.chart.repo: must be an http(s) URL without a password",
        ),
        (
            {"namespace": "web", "chart": REPO | {"version": "--devel"}},
            "spec.chart.version: '--devel' is not a chart version",
        ),
        (
            {"namespace": "web", "chart": {"oci": "https://r.example.com/c"}},
            "spec.chart.oci: 'https://r.example.com/c' is not an oci://",
        ),
        (
            {"namespace": "web", "chart": {"git": {"url": "https://g.example.com/x"}}},
            "spec.chart.git.ref: required",
        ),
        (
            {
                "namespace": "web",
                "chart": {"git": {"url": "https://g.example.com/x", "ref": "m"}, "version": "1"},
            },
            "spec.chart.version: unknown field",
        ),
        ({"namespace": "web", "chart": REPO, "release": "Web"}, "spec.release: 'Web' is not"),
        ({"namespace": "web", "chart": REPO, "values": []}, "spec.values: must be a mapping"),
        ({"namespace": "web", "chart": REPO, "wait": 1}, "spec.wait: must be true or false"),
        ({"namespace": "web", "chart": REPO, "timeout": "5"}, "spec.timeout: must be a duration"),
        ({"namespace": "web", "chart": REPO, "set": {}}, "spec.set: unknown field"),
        (
            {
                "namespace": "web",
                "chart": REPO,
                "values": {"a": {"secretRef": {"name": "x", "key": "k"}}},
            },
            "spec.values.a.secretRef.namespace: required",
        ),
    ],
)
def test_helm_errors_name_the_field(spec: dict[str, Any], message: str) -> None:
    assert str(refused(command("helm", spec))).startswith(message)


def test_a_default_release_name_too_long_for_helm_is_refused_in_a_flow() -> None:
    document = {
        "apiVersion": "tunnel/v1",
        "type": "flow",
        "name": "a" * 40,
        "spec": {"steps": [{"name": "b" * 20, "type": "helm", "namespace": "web", "chart": REPO}]},
    }
    error = refused(document)
    assert error.path == "spec.steps[0].release"
    assert "longer than 53 characters; set release" in error.problem
