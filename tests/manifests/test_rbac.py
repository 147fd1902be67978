"""The agent's RBAC: what each variant may and may not do, worked out from its objects."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from .rbac import Grant, allows, grants
from .support import (
    PACKAGE_MANIFESTS,
    USER_MANIFESTS,
    VARIANTS,
    AgentValues,
    Object,
    built,
    containers,
    find,
    render,
)

VALUES = AgentValues()
AGENT_NS = VALUES.namespace
OWN_SECRETS = ("tunnel-agent-credentials", "tunnel-agent-credentials-commands")
WRITES = ("create", "update", "patch", "delete", "deletecollection")
RUNS_SOMETHING = ("pods/exec", "pods/attach", "pods/portforward", "services/proxy", "nodes/proxy")


def _objects(variant: str) -> list[Object]:
    return render(variant, VALUES.for_variant(variant))


def kustomize_objects(path: Path) -> list[Object]:
    """The objects of one manifest file, bound to the agent in the values' namespace."""
    objects = [obj for obj in yaml.safe_load_all(path.read_text()) if obj is not None]
    for obj in objects:
        for subject in obj.get("subjects") or []:
            subject["namespace"] = AGENT_NS
    return objects


def _agent(variant: str) -> list[Grant]:
    return grants(_objects(variant), AGENT_NS, "tunnel-agent")


def _all_builds() -> list[tuple[str, list[Object]]]:
    found = [(f"render {variant}", _objects(variant)) for variant in VARIANTS]
    for directory in ("agent/full", "agent/read-only", "agent/namespaced", "server"):
        found.append((f"kustomize {directory}", built(USER_MANIFESTS / directory)))
    return found


@pytest.mark.parametrize(("where", "objects"), _all_builds(), ids=lambda value: str(value)[:40])
def test_no_role_grants_a_wildcard(where: str, objects: list[Object]) -> None:
    """No Role or ClusterRole uses "*" for groups, resources or verbs (let alone * on *)."""
    for obj in objects:
        if obj["kind"] not in ("Role", "ClusterRole"):
            continue
        for rule in obj.get("rules") or []:
            for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(field, []), f"{where}: {obj['metadata']['name']}"
                assert not any("*" in entry for entry in rule.get(field, [])), (
                    f"{where}: {obj['metadata']['name']} {field}"
                )


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_may_keep_its_credentials_and_journal(variant: str) -> None:
    granted = _agent(variant)
    assert allows(granted, "create", "secrets", namespace=AGENT_NS)
    for name in OWN_SECRETS:
        for verb in ("get", "update"):  # read, then replace (credentials.py)
            assert allows(granted, verb, "secrets", namespace=AGENT_NS, name=name), (verb, name)


def test_the_journal_secret_rbac_follows_the_credentials_secret_name() -> None:
    """The agent names its journal <credentials>-commands; the Role lists exactly both."""
    deployment = find(_objects("full"), "Deployment", "tunnel-agent")
    [agent] = containers(deployment)
    env = {variable["name"]: variable.get("value") for variable in agent["env"]}
    namespace, name = env["TUNNEL_AGENT_CREDENTIALS_SECRET"].split("/")
    assert namespace == AGENT_NS
    role = find(_objects("full"), "Role", "tunnel-agent", AGENT_NS)
    named = [rule for rule in role["rules"] if rule.get("resourceNames")]
    assert named == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": [name, f"{name}-commands"],
            "verbs": ["get", "update"],
        }
    ]


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_impersonates_users_and_groups_only(variant: str) -> None:
    granted = _agent(variant)
    assert allows(granted, "impersonate", "users", name="tunnel:alice")
    assert allows(granted, "impersonate", "groups", name="tunnel:platform")
    assert not allows(granted, "impersonate", "serviceaccounts", namespace="default", name="x")
    assert not allows(granted, "impersonate", "uids", group="authentication.k8s.io", name="1")
    assert not allows(
        granted, "impersonate", "userextras/scopes", group="authentication.k8s.io", name="a"
    )


def test_the_read_only_variant_cannot_read_secrets() -> None:
    granted = _agent("read-only")
    for namespace in ("default", "kube-system", AGENT_NS):
        for verb in ("get", "list", "watch"):
            assert not allows(
                granted, verb, "secrets", namespace=namespace, name="database-password"
            ), (verb, namespace)
    assert not allows(granted, "list", "secrets", namespace=AGENT_NS)
    assert not allows(granted, "get", "secrets", namespace=AGENT_NS, name="tunnel-agent-bootstrap")


def test_the_read_only_variant_cannot_run_anything_or_write() -> None:
    granted = _agent("read-only")
    for resource in RUNS_SOMETHING:
        for verb in ("get", "create"):
            assert not allows(granted, verb, resource, namespace="default", name="web")
    writable = sorted(
        (verb, tuple(grant.rule["resources"]), grant.namespace)
        for grant in granted
        for verb in grant.rule["verbs"]
        if verb in WRITES
    )
    # Its own Secrets are the only thing it may change.
    assert writable == [
        ("create", ("secrets",), AGENT_NS),
        ("update", ("secrets",), AGENT_NS),
    ]


def test_the_read_only_variant_may_read_workloads_and_logs() -> None:
    granted = _agent("read-only")
    assert allows(granted, "list", "pods", namespace="default")
    assert allows(granted, "get", "pods/log", namespace="default", name="web")
    assert allows(granted, "watch", "deployments", group="apps", namespace="default")
    assert allows(granted, "list", "configmaps", namespace="default")


def test_the_read_only_variant_tells_the_agent_to_refuse_writes() -> None:
    [agent] = containers(find(_objects("read-only"), "Deployment", "tunnel-agent"))
    assert {"name": "TUNNEL_AGENT_READ_ONLY", "value": "true"} in agent["env"]


def test_the_full_variant_changes_nothing_outside_its_namespace() -> None:
    """Commands act as their submitters: the agent itself needs no rights to change objects."""
    granted = _agent("full")
    for group, resource in [
        ("", "configmaps"),
        ("", "secrets"),
        ("apps", "deployments"),
        ("rbac.authorization.k8s.io", "clusterrolebindings"),
        ("coordination.k8s.io", "leases"),
    ]:
        for verb in ("get", "create", "patch", "delete"):
            assert not allows(granted, verb, resource, group=group, namespace="default"), resource
    assert not allows(granted, "escalate", "clusterroles", group="rbac.authorization.k8s.io")
    # Its workspace: apply-set records, OpenTofu state and its lock.
    assert allows(granted, "patch", "configmaps", namespace=AGENT_NS, name="tunnel-applyset-web")
    assert allows(granted, "get", "secrets", namespace=AGENT_NS, name="tfstate-default-web")
    assert allows(granted, "update", "leases", group="coordination.k8s.io", namespace=AGENT_NS)


def _as_agent() -> list[Grant]:
    """The full variant with the commands-as-agent component, built by the real kustomize."""
    component = PACKAGE_MANIFESTS / "agent" / "components" / "commands-as-agent"
    extra = kustomize_objects(component / "commands-rbac.yaml")
    return grants([*_objects("full"), *extra], AGENT_NS, "tunnel-agent")


def test_the_commands_as_agent_component_may_apply_manifests_cluster_wide() -> None:
    granted = _as_agent()
    for group, resource in [
        ("", "configmaps"),
        ("", "secrets"),
        ("", "services"),
        ("", "namespaces"),
        ("apps", "deployments"),
        ("batch", "cronjobs"),
        ("networking.k8s.io", "ingresses"),
        ("rbac.authorization.k8s.io", "clusterrolebindings"),
        ("apiextensions.k8s.io", "customresourcedefinitions"),
        ("coordination.k8s.io", "leases"),
    ]:
        for verb in ("get", "list", "create", "patch", "delete"):
            assert allows(granted, verb, resource, group=group, namespace="default"), resource
    assert allows(granted, "escalate", "clusterroles", group="rbac.authorization.k8s.io")
    assert not allows(granted, "create", "pods/exec", namespace="default", name="web")


def test_the_commands_as_agent_component_aggregates_labelled_cluster_roles() -> None:
    component = PACKAGE_MANIFESTS / "agent" / "components" / "commands-as-agent"
    objects = [*_objects("full"), *kustomize_objects(component / "commands-rbac.yaml")]
    commands = find(objects, "ClusterRole", "tunnel-agent-commands")
    selector = commands["aggregationRule"]["clusterRoleSelectors"][0]["matchLabels"]
    builtin = find(objects, "ClusterRole", "tunnel-agent-commands-builtin")
    assert selector.items() <= builtin["metadata"]["labels"].items()
    extension: Object = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "extension", "labels": dict(selector)},
        "rules": [
            {"apiGroups": ["cert-manager.io"], "resources": ["certificates"], "verbs": ["create"]}
        ],
    }
    granted = grants([*objects, extension], AGENT_NS, "tunnel-agent")
    assert allows(granted, "create", "certificates", group="cert-manager.io", namespace="x")


def test_the_namespaced_variant_works_in_its_namespaces_only() -> None:
    granted = _agent("namespaced")
    for namespace in VALUES.namespaces:
        assert allows(granted, "create", "deployments", group="apps", namespace=namespace)
        assert allows(granted, "get", "secrets", namespace=namespace, name="app-config")
        assert allows(granted, "bind", "clusterroles", group="rbac.authorization.k8s.io",
                      namespace=namespace, name="view")  # fmt: skip
    for namespace in ("default", "kube-system", "team-c"):
        assert not allows(granted, "create", "deployments", group="apps", namespace=namespace)
        assert not allows(granted, "get", "secrets", namespace=namespace, name="app-config")
    assert not allows(granted, "create", "namespaces")
    assert not allows(granted, "create", "clusterroles", group="rbac.authorization.k8s.io")
    assert not allows(granted, "list", "pods")  # cluster-wide


def test_the_namespaced_variant_keeps_apply_records_but_no_secrets_in_its_own_namespace() -> None:
    granted = _agent("namespaced")
    assert allows(granted, "create", "configmaps", namespace=AGENT_NS)
    # It may create its credentials there (base), but read back only those, by
    # name: a token minted there for its ServiceAccount, which may impersonate
    # anyone, stays out of reach. (So no OpenTofu state either: no tofu.)
    assert not allows(granted, "get", "secrets", namespace=AGENT_NS, name="minted")
    assert not allows(granted, "get", "secrets", namespace=AGENT_NS, name="tfstate-default-web")
    assert not allows(granted, "update", "leases", group="coordination.k8s.io", namespace=AGENT_NS)


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_binding_names_the_agent_service_account(variant: str) -> None:
    for obj in _objects(variant):
        if obj["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            assert obj["subjects"] == [
                {"kind": "ServiceAccount", "name": "tunnel-agent", "namespace": AGENT_NS}
            ]


@pytest.mark.parametrize("variant", ["full", "namespaced"])
def test_the_agent_may_run_jobs_in_its_namespace_only(variant: str) -> None:
    granted = _agent(variant)
    for verb in ("create", "get", "watch", "delete"):
        assert allows(granted, verb, "jobs", group="batch", namespace=AGENT_NS)
        assert not allows(granted, verb, "jobs", group="batch", namespace="default")
    assert allows(granted, "get", "pods/log", namespace=AGENT_NS, name="tunnel-run-x")
    assert allows(granted, "delete", "secrets", namespace=AGENT_NS, name="tunnel-run-x")
    assert not allows(granted, "create", "pods/exec", namespace=AGENT_NS, name="tunnel-run-x")
