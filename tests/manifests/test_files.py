"""Every manifest file parses, every object is named, every kustomization builds."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from .support import (
    CLUSTER_SCOPED,
    PACKAGE_MANIFESTS,
    REPO,
    USER_MANIFESTS,
    built,
    documents,
    kustomization_dirs,
    yaml_files,
)

FILES = yaml_files()
BUILDS = kustomization_dirs()


def _id(path: Path) -> str:
    return str(path.relative_to(REPO))


def _resource_files() -> list[Path]:
    """The files kustomizations (and components) list as resources (whole objects)."""
    found = set()
    components = [path.parent for path in PACKAGE_MANIFESTS.rglob("kustomization.yaml")]
    for directory in {*BUILDS, *components}:
        kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
        for entry in kustomization.get("resources", []):
            path = (directory / entry).resolve()
            if path.is_file():
                found.add(path)
    return sorted(found)


RESOURCE_FILES = _resource_files()


def test_the_trees_hold_the_expected_kustomizations() -> None:
    """The layout the README and tunnel_server/agents/manifest.py rely on is there."""
    expected = {
        PACKAGE_MANIFESTS / "agent" / "base",
        PACKAGE_MANIFESTS / "agent" / "namespace-access",
        PACKAGE_MANIFESTS / "server" / "base",
        PACKAGE_MANIFESTS / "server" / "ha",
        USER_MANIFESTS / "server",
        USER_MANIFESTS / "server-ha",
        USER_MANIFESTS / "agent" / "namespaced" / "namespaces" / "example",
    }
    for variant in ("full", "read-only", "namespaced"):
        expected.add(PACKAGE_MANIFESTS / "agent" / "overlays" / variant)
        expected.add(USER_MANIFESTS / "agent" / variant)
    assert set(BUILDS) == expected
    for component in ("cluster-values", "namespaces"):
        assert (
            PACKAGE_MANIFESTS / "agent" / "components" / component / "kustomization.yaml"
        ).is_file()


@pytest.mark.parametrize("path", FILES, ids=_id)
def test_every_manifest_file_parses_into_mappings(path: Path) -> None:
    found = documents(path)
    assert found, f"{path} is empty"
    assert all(isinstance(document, dict) for document in found)


@pytest.mark.parametrize("path", RESOURCE_FILES, ids=_id)
def test_every_resource_is_a_named_object_with_its_namespace(path: Path) -> None:
    for obj in documents(path):
        assert isinstance(obj.get("apiVersion"), str)
        assert obj["apiVersion"]
        assert isinstance(obj.get("kind"), str)
        assert obj["kind"]
        metadata = obj.get("metadata")
        assert isinstance(metadata, dict)
        assert metadata.get("name")
        if obj["kind"] in CLUSTER_SCOPED or obj["kind"] == "AgentValues":
            assert "namespace" not in metadata, f"{obj['kind']} {metadata['name']}"
        else:
            assert metadata.get("namespace"), f"{obj['kind']} {metadata['name']} has no namespace"


@pytest.mark.parametrize("directory", BUILDS, ids=_id)
def test_kubectl_kustomize_builds_every_kustomization(directory: Path) -> None:
    objects = built(directory)
    assert objects
    for obj in objects:
        assert obj["apiVersion"]
        assert obj["kind"]
        assert obj["metadata"]["name"]
        if obj["kind"] not in CLUSTER_SCOPED:
            assert obj["metadata"].get("namespace"), f"{obj['kind']} {obj['metadata']['name']}"
    ids = [
        (obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"]) for obj in objects
    ]
    assert len(ids) == len(set(ids)), "duplicate objects"
    # The values object is local configuration: it never reaches the cluster.
    assert not [obj for obj in objects if obj["kind"] == "AgentValues"]


def test_every_packaged_file_is_used_by_a_kustomization() -> None:
    """No stray file in the package tree: each is a kustomization or listed in one
    (as a resource, or as a patch)."""
    listed = {path.resolve() for path in RESOURCE_FILES}
    for directory in BUILDS:
        kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
        for patch in kustomization.get("patches", []):
            if "path" in patch:
                listed.add((directory / patch["path"]).resolve())
    for path in PACKAGE_MANIFESTS.rglob("*.yaml"):
        assert path.name == "kustomization.yaml" or path.resolve() in listed, path
