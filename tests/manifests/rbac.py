"""What a ServiceAccount may do, worked out from the RBAC objects of a manifest.

A small model of Kubernetes' RBAC authorizer, enough for the manifests'
rules: Roles and ClusterRoles bound by RoleBindings and ClusterRoleBindings,
ClusterRole aggregation by matchLabels, resourceNames, and "*" (which the
manifests must not use, but which the model honours so a test can catch it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Object = dict[str, Any]


@dataclass(frozen=True)
class Grant:
    """One rule, and the namespace it holds in (None: every namespace and cluster-wide)."""

    namespace: str | None
    rule: Object


def _rules(role: Object, objects: list[Object]) -> list[Object]:
    aggregation = role.get("aggregationRule")
    if aggregation is None:
        rules: list[Object] = role.get("rules") or []
        return rules
    found: list[Object] = []
    for selector in aggregation["clusterRoleSelectors"]:
        wanted = selector["matchLabels"].items()
        for other in objects:
            labels = other["metadata"].get("labels") or {}
            if other["kind"] == "ClusterRole" and wanted <= labels.items():
                found.extend(other.get("rules") or [])
    return found


def grants(objects: list[Object], namespace: str, name: str) -> list[Grant]:
    """Every rule bound to the ServiceAccount ``namespace/name``."""
    subject = {"kind": "ServiceAccount", "name": name, "namespace": namespace}
    roles = {
        (obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"]): obj
        for obj in objects
        if obj["kind"] in ("Role", "ClusterRole")
    }
    found: list[Grant] = []
    for binding in objects:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if subject not in binding.get("subjects", []):
            continue
        where = binding["metadata"].get("namespace")
        reference = binding["roleRef"]
        role_namespace = where if reference["kind"] == "Role" else None
        role = roles[(reference["kind"], role_namespace, reference["name"])]
        scope = where if binding["kind"] == "RoleBinding" else None
        found.extend(Grant(scope, rule) for rule in _rules(role, objects))
    return found


def allows(
    granted: list[Grant],
    verb: str,
    resource: str,
    *,
    group: str = "",
    namespace: str | None = None,
    name: str | None = None,
) -> bool:
    """Whether a request is allowed: ``namespace`` None means cluster-wide or all namespaces."""
    for grant in granted:
        if grant.namespace is not None and grant.namespace != namespace:
            continue
        rule = grant.rule
        if not _matches(rule.get("verbs", []), verb):
            continue
        if not _matches(rule.get("apiGroups", []), group):
            continue
        if not _matches(rule.get("resources", []), resource):
            continue
        names = rule.get("resourceNames")
        if names and name not in names:
            continue
        return True
    return False


def _matches(listed: list[str], value: str) -> bool:
    return "*" in listed or value in listed
