"""Building the manifests: with the real kustomize in kubectl, and reading their objects.

Shared by tests/manifests and tests/images. Builds of the repository's own
directories are cached (the files do not change during a run); builds with
other values copy both manifest trees to a temporary directory first, so the
repository is never written to.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tunnel_server.agents.manifest import render_agent_manifest

REPO = Path(__file__).resolve().parents[2]
PACKAGE_MANIFESTS = REPO / "tunnel_server" / "manifests"
USER_MANIFESTS = REPO / "manifests"
VARIANTS = ("full", "read-only", "namespaced")
#: Kinds without a namespace.
CLUSTER_SCOPED = frozenset(
    {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "PersistentVolume",
        "StorageClass",
        "PriorityClass",
    }
)

Object = dict[str, Any]


def kubectl() -> str:
    """The real kubectl (its built-in kustomize builds the manifests)."""
    path = shutil.which("kubectl")
    assert path is not None, "these tests need kubectl on the PATH"
    return path


def kustomize(directory: Path) -> list[Object]:
    """The objects ``kubectl kustomize directory`` prints, in its order."""
    run = subprocess.run(
        [kubectl(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, f"kubectl kustomize {directory} failed:\n{run.stderr}"
    return [obj for obj in yaml.safe_load_all(run.stdout) if obj is not None]


@functools.cache
def _built(directory: str) -> tuple[str, ...]:
    return tuple(yaml.safe_dump(obj) for obj in kustomize(Path(directory)))


def built(directory: Path) -> list[Object]:
    """``kustomize(directory)`` for a directory of the repository, built once per run."""
    return [yaml.safe_load(text) for text in _built(str(directory))]


def yaml_files() -> list[Path]:
    """Every YAML file of both manifest trees."""
    return sorted([*PACKAGE_MANIFESTS.rglob("*.yaml"), *USER_MANIFESTS.rglob("*.yaml")])


def kustomization_dirs() -> list[Path]:
    """Every directory holding a buildable Kustomization (components are not)."""
    found = []
    for path in yaml_files():
        if path.name == "kustomization.yaml":
            document = yaml.safe_load(path.read_text())
            if document.get("kind", "Kustomization") == "Kustomization":
                found.append(path.parent)
    return found


def documents(path: Path) -> list[Any]:
    return [document for document in yaml.safe_load_all(path.read_text()) if document is not None]


@dataclass(frozen=True)
class AgentValues:
    """A cluster's values, as the arguments of render_agent_manifest and as values.yaml."""

    cluster: str = "prod-eu"
    server_url: str = "https://tunnel.corp.test:9443"
    server_port: int = 9443
    ca_pem: str = (
        "-----BEGIN CERTIFICATE-----\n"
        "MIIBszCCAVmgAwIBAgIUZmFrZSBjZXJ0aWZpY2F0ZSBmb3IgdGVzdHMwCgYIKoZI\n"
        "-----END CERTIFICATE-----\n"
        "-----BEGIN CERTIFICATE-----\n"
        "MIIBtDCCAVqgAwIBAgIUc2Vjb25kIGNlcnRpZmljYXRlIGluIHRoZSBidW5kbGUw\n"
        "-----END CERTIFICATE-----\n"
    )
    bootstrap_token: str = "tbt_g2kP0xWq7mZbR1fNcY3uLhA9sVt5eJdQoI8wXyB6zK4"
    image: str = "registry.corp.test/tunnel-agent:1.2.3"
    namespace: str = "agents"
    namespaces: tuple[str, ...] = ("team-a", "team-b")

    def for_variant(self, variant: str, namespace: str | None = None) -> AgentValues:
        """These values with the namespaces only the namespaced variant takes."""
        return AgentValues(
            cluster=self.cluster,
            server_url=self.server_url,
            server_port=self.server_port,
            ca_pem=self.ca_pem,
            bootstrap_token=self.bootstrap_token,
            image=self.image,
            namespace=namespace or self.namespace,
            namespaces=self.namespaces if variant == "namespaced" else (),
        )

    def object(self) -> Object:
        spec: dict[str, Any] = {
            "cluster": self.cluster,
            "serverUrl": self.server_url,
            "serverPort": self.server_port,
            "caBundle": self.ca_pem,
            "bootstrapToken": self.bootstrap_token,
            "image": self.image,
            "namespace": self.namespace,
        }
        if self.namespaces:
            spec["namespaces"] = ",".join(self.namespaces)
        return {
            "apiVersion": "kustomize.k8s-reverse-tunnel/v1",
            "kind": "AgentValues",
            "metadata": {
                "name": "tunnel-agent-values",
                "annotations": {"config.kubernetes.io/local-config": "true"},
            },
            "spec": spec,
        }


def render(variant: str, values: AgentValues) -> list[Object]:
    """The objects render_agent_manifest makes for ``variant`` with ``values``."""
    text = render_agent_manifest(
        cluster=values.cluster,
        server_url=values.server_url,
        ca_pem=values.ca_pem,
        bootstrap_token=values.bootstrap_token,
        image=values.image,
        namespace=values.namespace,
        rbac=variant,
        namespaces=values.namespaces,
    )
    return [obj for obj in yaml.safe_load_all(text) if obj is not None]


def build_user_variant(workdir: Path, variant: str, values: AgentValues) -> list[Object]:
    """``kubectl kustomize manifests/agent/<variant>`` with ``values`` filled in as a user would.

    Both trees are copied under ``workdir``; values.yaml is replaced, and for
    the namespaced variant each namespace gets its directory (a copy of
    namespaces/example with its namespace set) listed in the kustomization.
    """
    shutil.copytree(PACKAGE_MANIFESTS, workdir / "tunnel_server" / "manifests")
    shutil.copytree(USER_MANIFESTS, workdir / "manifests")
    directory = workdir / "manifests" / "agent" / variant
    (directory / "values.yaml").write_text(yaml.safe_dump(values.object(), sort_keys=False))
    if variant == "namespaced":
        kustomization_file = directory / "kustomization.yaml"
        kustomization = yaml.safe_load(kustomization_file.read_text())
        example = directory / "namespaces" / "example"
        resources = [entry for entry in kustomization["resources"] if entry != "namespaces/example"]
        for name in values.namespaces:
            target = directory / "namespaces" / name
            shutil.copytree(example, target)
            access = yaml.safe_load((target / "kustomization.yaml").read_text())
            access["namespace"] = name
            (target / "kustomization.yaml").write_text(yaml.safe_dump(access))
            resources.append(f"namespaces/{name}")
        shutil.rmtree(example)
        kustomization["resources"] = resources
        kustomization_file.write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return kustomize(directory)


def find(objects: list[Object], kind: str, name: str, namespace: str | None = None) -> Object:
    """The one object of ``kind`` named ``name`` (in ``namespace`` when given)."""
    found = [
        obj
        for obj in objects
        if obj["kind"] == kind
        and obj["metadata"]["name"] == name
        and (namespace is None or obj["metadata"].get("namespace") == namespace)
    ]
    assert len(found) == 1, f"{len(found)} {kind} objects named {name}"
    return found[0]


def containers(deployment: Object) -> list[Object]:
    spec: list[Object] = deployment["spec"]["template"]["spec"]["containers"]
    return spec


def env_names(objects: list[Object]) -> Iterator[str]:
    """The names of the environment variables the objects' containers set."""
    for obj in objects:
        template = obj.get("spec", {}).get("template", {})
        for container in template.get("spec", {}).get("containers", []):
            for variable in container.get("env", []):
                yield variable["name"]
