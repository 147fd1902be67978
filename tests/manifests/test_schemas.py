"""Every object validates against the Kubernetes 1.30 and newest schemas, offline and strictly.

kubernetes-validate ships the JSON schemas of each Kubernetes release; strict
mode refuses fields the schema does not know, so a misspelt field fails.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import kubernetes_validate  # type: ignore[import-untyped]
import pytest

from .support import (
    PACKAGE_MANIFESTS,
    REPO,
    USER_MANIFESTS,
    VARIANTS,
    AgentValues,
    Object,
    built,
    kustomization_dirs,
    kustomize,
    render,
)

#: The oldest Kubernetes the manifests support, and the newest schemas shipped.
VERSIONS = ("1.30.0", kubernetes_validate.latest_version())


def _validate(obj: Object, version: str) -> None:
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = f"{obj['kind']} {obj['metadata'].get('name')}"
        raise AssertionError(f"{where} is invalid for Kubernetes {version}: {exc}") from exc


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    "directory", kustomization_dirs(), ids=lambda path: str(path.relative_to(REPO))
)
def test_every_build_validates_against_the_kubernetes_schemas(
    directory: Path, version: str
) -> None:
    for obj in built(directory):
        _validate(obj, version)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_rendered_variant_validates_against_the_kubernetes_schemas(
    variant: str, version: str
) -> None:
    for obj in render(variant, AgentValues().for_variant(variant)):
        _validate(obj, version)


def test_the_server_with_its_own_certificate_validates(tmp_path: Path) -> None:
    """The optional tls.yaml patch also yields valid objects."""
    shutil.copytree(PACKAGE_MANIFESTS, tmp_path / "tunnel_server" / "manifests")
    shutil.copytree(USER_MANIFESTS, tmp_path / "manifests")
    kustomization = tmp_path / "manifests" / "server" / "kustomization.yaml"
    text = kustomization.read_text()
    assert "  # - path: tls.yaml" in text
    kustomization.write_text(text.replace("  # - path: tls.yaml", "  - path: tls.yaml"))
    objects = kustomize(tmp_path / "manifests" / "server")
    for obj in objects:
        for version in VERSIONS:
            _validate(obj, version)
    [deployment] = [obj for obj in objects if obj["kind"] == "Deployment"]
    names = {env["name"] for env in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert {"TUNNEL_SERVER_TLS_CERT", "TUNNEL_SERVER_TLS_KEY", "TUNNEL_SERVER_TLS_CA"} <= names


def test_strict_validation_refuses_an_unknown_field() -> None:
    """The validator really checks, offline: a misspelt field fails."""
    deployment = copy.deepcopy(
        next(obj for obj in built(USER_MANIFESTS / "server") if obj["kind"] == "Deployment")
    )
    _validate(deployment, VERSIONS[0])
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContxt"] = {}
    with pytest.raises(AssertionError, match="securityContxt"):
        _validate(deployment, VERSIONS[0])
