"""``type: manifests`` specs (tunnel_commands.manifests)."""

from __future__ import annotations

from typing import Any

import pytest

from tunnel_commands import ManifestsSpec, SecretRef, parse_command
from tunnel_commands.manifests import DEFAULT_WAIT, MAX_OBJECTS

from .helpers import command, refused, round_trips

DEPLOYMENT = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "web", "labels": {"app": "web"}},
    "spec": {"replicas": 2},
}
CONFIGMAP = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {}}


def _spec(document: dict[str, Any]) -> ManifestsSpec:
    spec = parse_command(document).spec
    assert isinstance(spec, ManifestsSpec)
    return spec


def test_objects_are_read_with_the_defaults() -> None:
    spec = _spec(command("manifests", {"objects": [DEPLOYMENT, CONFIGMAP]}))
    assert spec.objects == (DEPLOYMENT, CONFIGMAP)
    assert spec.namespace is None
    assert spec.prune is False
    assert spec.wait_timeout == DEFAULT_WAIT == 300
    assert spec.apply_set == "web-app"


def test_every_field_is_read_and_round_trips() -> None:
    document = command(
        "manifests",
        {
            "objects": [DEPLOYMENT],
            "namespace": "web",
            "prune": True,
            "wait": {"timeout": "2m"},
            "applySet": "web-set",
        },
    )
    spec = _spec(document)
    assert (spec.namespace, spec.prune, spec.wait_timeout, spec.apply_set) == (
        "web",
        True,
        120,
        "web-set",
    )
    round_trips(parse_command(document))


@pytest.mark.parametrize(("wait", "expected"), [(False, None), (True, 300), ({}, 300)])
def test_wait_may_be_turned_off_or_left_at_its_default(wait: Any, expected: int | None) -> None:
    assert _spec(command("manifests", {"objects": [CONFIGMAP], "wait": wait})).wait_timeout == (
        expected
    )


def test_multi_document_yaml_is_parsed_into_objects() -> None:
    text = """
apiVersion: v1
kind: ConfigMap
metadata: {name: cfg}
---
# an empty document is skipped
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, labels: {app: web}}
spec: {replicas: 2}
"""
    spec = _spec(command("manifests", {"yaml": text}))
    assert [obj["kind"] for obj in spec.objects] == ["ConfigMap", "Deployment"]
    assert spec.objects[1] == DEPLOYMENT
    round_trips(parse_command(command("manifests", {"yaml": text})))


def test_a_list_document_is_flattened_into_its_items() -> None:
    listed = {"apiVersion": "v1", "kind": "List", "items": [CONFIGMAP, DEPLOYMENT]}
    spec = _spec(command("manifests", {"objects": [listed]}))
    assert spec.objects == (CONFIGMAP, DEPLOYMENT)


def test_secret_refs_anywhere_in_an_object_are_parsed() -> None:
    ref = {"secretRef": {"namespace": "vault", "name": "db", "key": "password"}}
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "db"},
        "stringData": {"password": ref, "nested": [{"deep": ref}]},
    }
    spec = _spec(command("manifests", {"objects": [secret]}))
    expected = SecretRef("vault", "db", "password")
    string_data = spec.objects[0]["stringData"]
    assert isinstance(string_data, dict)
    assert string_data["password"] == expected
    assert string_data["nested"] == [{"deep": expected}]


def test_kubernetes_own_secret_ref_fields_stay_as_written() -> None:
    pod_spec = {"containers": [{"name": "app", "envFrom": [{"secretRef": {"name": "env"}}]}]}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": pod_spec}
    spec = _spec(command("manifests", {"objects": [pod]}))
    assert spec.objects[0]["spec"] == pod_spec


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({}, "spec: needs one of objects, yaml"),
        ({"objects": [CONFIGMAP], "yaml": "x: 1"}, "spec: must have only one of objects, yaml"),
        ({"objects": CONFIGMAP}, "spec.objects: must be a list"),
        ({"objects": ["cfg"]}, "spec.objects[0]: must be a Kubernetes object (a mapping)"),
        ({"objects": [{"kind": "ConfigMap"}]}, "spec.objects[0].apiVersion: required"),
        ({"objects": [CONFIGMAP | {"kind": None}]}, "spec.objects[0].kind: required"),
        ({"objects": [CONFIGMAP | {"kind": "configmap"}]}, "spec.objects[0].kind: 'configmap'"),
        ({"objects": [CONFIGMAP | {"apiVersion": "apps"}]}, "spec.objects[0].apiVersion: 'apps'"),
        ({"objects": [CONFIGMAP | {"metadata": None}]}, "spec.objects[0].metadata: required"),
        ({"objects": [CONFIGMAP | {"metadata": {}}]}, "spec.objects[0].metadata.name: required"),
        (
            {"objects": [CONFIGMAP | {"metadata": {"name": "a/b"}}]},
            "spec.objects[0].metadata.name: 'a/b' is not an object name",
        ),
        (
            {"objects": [CONFIGMAP | {"metadata": {"name": "x", "namespace": "Web"}}]},
            "spec.objects[0].metadata.namespace: 'Web' is not a namespace name",
        ),
        (
            {"objects": [CONFIGMAP | {"metadata": {"name": "x", "labels": {"a": 1}}}]},
            "spec.objects[0].metadata.labels.a: must be a string",
        ),
        ({"objects": [CONFIGMAP, CONFIGMAP]}, "spec.objects[1]: is the same object as"),
        ({"yaml": "a: [\n"}, "spec.yaml: not valid YAML: "),
        ({"yaml": "just text"}, "spec.yaml[0]: must be a Kubernetes object (a mapping)"),
        ({"objects": [], "namespace": "Web"}, "spec.namespace: 'Web' is not a namespace name"),
        ({"objects": [], "prune": "yes"}, "spec.prune: must be true or false"),
        ({"objects": [], "wait": {"timeout": "1d"}}, "spec.wait.timeout: must be a duration"),
        ({"objects": [], "wait": {"timeout": "25h"}}, "spec.wait.timeout: must be between"),
        ({"objects": [], "wait": {"time": "1m"}}, "spec.wait.time: unknown field"),
        ({"objects": [], "applySet": "A"}, "spec.applySet: 'A' is not"),
        ({"objects": [], "server": "x"}, "spec.server: unknown field"),
    ],
)
def test_manifests_errors_name_the_field(spec: dict[str, Any], message: str) -> None:
    assert str(refused(command("manifests", spec))).startswith(message)


def test_the_same_name_in_two_namespaces_is_two_objects() -> None:
    first = CONFIGMAP | {"metadata": {"name": "cfg", "namespace": "a"}}
    second = CONFIGMAP | {"metadata": {"name": "cfg", "namespace": "b"}}
    assert len(_spec(command("manifests", {"objects": [first, second]})).objects) == 2


def test_more_objects_than_the_limit_are_refused() -> None:
    objects = [CONFIGMAP | {"metadata": {"name": f"c{i}"}} for i in range(MAX_OBJECTS + 1)]
    error = refused(command("manifests", {"objects": objects}))
    assert str(error) == f"spec.objects: must have at most {MAX_OBJECTS} items"
