"""The agent manifest renderer gives exactly what kustomize builds from the same files and values.

The renderer reads tunnel_server/manifests and applies the same overlays,
patches and replacements in Python; these tests build manifests/agent/<variant>
with the real kustomize, values filled in the way a user fills them, and
compare the objects one by one, in order.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tunnel_server.agents import manifest
from tunnel_server.agents.manifest import AGENT_NAMESPACE, ManifestError, render_agent_manifest

from .support import (
    PACKAGE_MANIFESTS,
    VARIANTS,
    AgentValues,
    build_user_variant,
    containers,
    find,
    render,
)


@pytest.mark.parametrize("namespace", [AGENT_NAMESPACE, "agents"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_python_render_equals_the_kustomize_build(
    variant: str, namespace: str, tmp_path: Path
) -> None:
    values = AgentValues().for_variant(variant, namespace)
    rendered = render(variant, values)
    kustomized = build_user_variant(tmp_path, variant, values)
    assert [_id(obj) for obj in rendered] == [_id(obj) for obj in kustomized]
    for ours, theirs in zip(rendered, kustomized, strict=True):
        assert ours == theirs, _id(ours)


def test_one_namespace_renders_as_kustomize_builds_it(tmp_path: Path) -> None:
    values = AgentValues(namespaces=("payments",))
    assert render("namespaced", values) == build_user_variant(tmp_path, "namespaced", values)


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_placeholder_is_filled(variant: str) -> None:
    """No placeholder of the packaged files survives rendering."""
    text = yaml.safe_dump_all(render(variant, AgentValues().for_variant(variant)))
    assert "REPLACE-" not in text
    assert "example" not in text
    assert "tunnel-agent/tunnel-agent-credentials" not in text  # the namespace moved


def test_the_bootstrap_secret_carries_the_values_verbatim() -> None:
    values = AgentValues()
    secret = find(render("full", values.for_variant("full")), "Secret", "tunnel-agent-bootstrap")
    assert secret["metadata"]["namespace"] == values.namespace
    assert secret["stringData"] == {
        "server-url": values.server_url,
        "cluster": values.cluster,
        "ca.crt": values.ca_pem,
        "bootstrap-token": values.bootstrap_token,
    }


def test_the_manifest_text_keeps_the_ca_bundle_as_a_block() -> None:
    """The CA bundle reads as PEM in the YAML a person applies."""
    values = AgentValues()
    text = render_agent_manifest(
        cluster=values.cluster,
        server_url=values.server_url,
        ca_pem=values.ca_pem,
        bootstrap_token=values.bootstrap_token,
        image=values.image,
    )
    assert "ca.crt: |\n" in text
    assert "-----BEGIN CERTIFICATE-----\n" in text


def test_the_image_the_credentials_secret_and_the_namespaces_are_set() -> None:
    values = AgentValues()
    objects = render("namespaced", values)
    [agent] = containers(find(objects, "Deployment", "tunnel-agent"))
    env = {variable["name"]: variable.get("value") for variable in agent["env"]}
    assert agent["image"] == values.image
    assert env["TUNNEL_AGENT_CREDENTIALS_SECRET"] == "agents/tunnel-agent-credentials"
    assert env["TUNNEL_AGENT_NAMESPACES"] == "team-a,team-b"
    assert env["TUNNEL_AGENT_COMMAND_TYPES"] == "manifests,helm,query,flow"  # no tofu
    for name in values.namespaces:
        find(objects, "Role", "tunnel-agent-commands", name)
        binding = find(objects, "RoleBinding", "tunnel-agent-commands", name)
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "tunnel-agent", "namespace": "agents"}
        ]


@pytest.mark.parametrize(
    ("url", "port"),
    [
        ("https://tunnel.corp.test", 443),
        ("https://tunnel.corp.test:8443", 8443),
        ("https://192.0.2.7:9443/", 9443),
        ("https://[2001:db8::7]:7443", 7443),
    ],
)
def test_the_network_policy_opens_the_port_of_the_server_url(url: str, port: int) -> None:
    values = AgentValues(server_url=url, namespaces=())
    policy = find(render("full", values), "NetworkPolicy", "tunnel-agent")
    assert policy["spec"]["egress"][2] == {"ports": [{"protocol": "TCP", "port": port}]}


def _arguments(**changes: Any) -> dict[str, Any]:
    values = AgentValues()
    arguments: dict[str, Any] = {
        "cluster": values.cluster,
        "server_url": values.server_url,
        "ca_pem": values.ca_pem,
        "bootstrap_token": values.bootstrap_token,
        "image": values.image,
    }
    arguments.update(changes)
    return arguments


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rbac": "admin"}, "rbac must be one of"),
        ({"rbac": "namespaced"}, "needs at least one namespace"),
        ({"namespaces": ("team-a",)}, "namespaced variant only"),
        ({"rbac": "namespaced", "namespaces": ("Team_A",)}, "not a namespace name"),
        ({"rbac": "namespaced", "namespaces": ("a", "a")}, "must not repeat"),
        ({"namespace": "tunnel agent"}, "not a namespace name"),
        ({"namespace": "agents\n"}, "not a namespace name"),
        ({"cluster": "Prod EU"}, "cluster"),
        ({"server_url": "http://tunnel.corp.test"}, "https://HOST"),
        ({"server_url": "https://user:pw@tunnel.corp.test"}, "credentials"),
        ({"server_url": "http://user:pw@tunnel.corp.test"}, "credentials"),
        ({"server_url": "https://tunnel.corp.test:99999"}, "not a URL"),
        ({"ca_pem": "not a certificate"}, "PEM"),
        ({"bootstrap_token": ""}, "bootstrap token"),
        ({"image": "registry/agent:1 --privileged"}, "image"),
    ],
)
def test_unusable_arguments_are_refused(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        render_agent_manifest(**_arguments(**changes))


def test_refusals_never_echo_secrets() -> None:
    with pytest.raises(ManifestError) as caught:
        render_agent_manifest(**_arguments(bootstrap_token="tbt_secret value"))
    assert "tbt_secret" not in str(caught.value)
    with pytest.raises(ManifestError) as caught:
        render_agent_manifest(**_arguments(server_url="https://user:hunter2@tunnel.corp.test:1x"))
    assert "hunter2" not in str(caught.value)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda k: k.update(namePrefix="x-"),
            "namePrefix, which tunnel_server/agents/manifest.py does not implement",
        ),
        (
            lambda k: k["patches"][0].update(patch="spec:\n  replicas: 2\n"),
            "only JSON patches",
        ),
        (
            lambda k: k["patches"][0].update(patch="- op: move\n  from: /a\n  path: /b\n"),
            "add, replace or remove",
        ),
        (
            lambda k: k["patches"][0]["target"].update(labelSelector="a=b"),
            "kind, name and namespace only",
        ),
    ],
)
def test_kustomize_features_the_renderer_lacks_are_refused(
    edit: Any, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Adding a kustomize feature to the files fails loudly rather than rendering wrongly."""
    root = tmp_path / "manifests"
    shutil.copytree(PACKAGE_MANIFESTS, root)
    path = root / "agent" / "overlays" / "read-only" / "kustomization.yaml"
    kustomization = yaml.safe_load(path.read_text())
    edit(kustomization)
    path.write_text(yaml.safe_dump(kustomization))
    monkeypatch.setattr(manifest, "_file", lambda relative: root.joinpath(*relative.split("/")))
    with pytest.raises(ManifestError, match=message):
        render_agent_manifest(**_arguments(rbac="read-only"))


def test_a_replacement_without_its_target_field_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As kustomize does: a replacement whose target path is missing is an error."""
    root = tmp_path / "manifests"
    shutil.copytree(PACKAGE_MANIFESTS, root)
    path = root / "agent" / "components" / "namespaces" / "kustomization.yaml"
    component = yaml.safe_load(path.read_text())
    target = component["replacements"][0]["targets"][0]
    target["fieldPaths"] = ["spec.template.spec.containers.[name=agent].env.[name=NOPE].value"]
    path.write_text(yaml.safe_dump(component))
    monkeypatch.setattr(manifest, "_file", lambda relative: root.joinpath(*relative.split("/")))
    with pytest.raises(ManifestError, match="NOPE"):
        render_agent_manifest(**_arguments(rbac="namespaced", namespaces=("team-a",)))


def test_a_reference_outside_the_package_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "manifests"
    shutil.copytree(PACKAGE_MANIFESTS, root)
    path = root / "agent" / "overlays" / "full" / "kustomization.yaml"
    kustomization = yaml.safe_load(path.read_text())
    kustomization["resources"].append("../../../../secrets.yaml")
    path.write_text(yaml.safe_dump(kustomization))
    monkeypatch.setattr(manifest, "_file", lambda relative: root.joinpath(*relative.split("/")))
    with pytest.raises(ManifestError, match="outside the packaged manifests"):
        render_agent_manifest(**_arguments())


def _id(obj: dict[str, Any]) -> tuple[str, str, str]:
    metadata = obj["metadata"]
    return obj["kind"], metadata.get("namespace", ""), metadata["name"]
