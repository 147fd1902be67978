"""The resource types the stand-in serves, as the API server's discovery describes them.

One :class:`ResourceKind` per resource (``pods``, ``deployments`` ...): its
group, version, kind, scope, verbs, short names and subresources. Discovery,
routing, tables and the store all read this registry; nothing else lists
resources.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "KINDS",
    "STORED_KINDS",
    "ResourceKind",
    "Subresource",
    "find_kind",
    "group_versions",
    "kinds_in",
    "require_kind",
]

_READ_WRITE = (
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
)


@dataclass(frozen=True, slots=True)
class Subresource:
    """A subresource such as ``pods/log``: its name, verbs and the kind it answers with."""

    name: str
    verbs: tuple[str, ...]
    kind: str
    group: str = ""
    version: str = "v1"


@dataclass(frozen=True, slots=True)
class ResourceKind:
    """One resource type: where it lives, what it is called, what may be done to it."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    verbs: tuple[str, ...] = _READ_WRITE
    subresources: tuple[Subresource, ...] = field(default_factory=tuple)

    @property
    def singular(self) -> str:
        """The singular resource name (``pod``)."""
        return self.kind.lower()

    @property
    def api_version(self) -> str:
        """``v1`` for the core group, ``group/version`` otherwise."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_version(self) -> tuple[str, str]:
        """The (group, version) pair."""
        return (self.group, self.version)

    def subresource(self, name: str) -> Subresource | None:
        """The subresource called ``name``, or None."""
        for sub in self.subresources:
            if sub.name == name:
                return sub
        return None


def _status(kind: str, group: str = "", version: str = "v1") -> Subresource:
    return Subresource("status", ("get", "patch", "update"), kind, group, version)


KINDS: tuple[ResourceKind, ...] = (
    ResourceKind(
        "",
        "v1",
        "namespaces",
        "Namespace",
        namespaced=False,
        short_names=("ns",),
        verbs=("create", "delete", "get", "list", "patch", "update", "watch"),
        subresources=(_status("Namespace"),),
    ),
    ResourceKind(
        "",
        "v1",
        "pods",
        "Pod",
        namespaced=True,
        short_names=("po",),
        categories=("all",),
        subresources=(
            Subresource("attach", ("create", "get"), "PodAttachOptions"),
            Subresource("exec", ("create", "get"), "PodExecOptions"),
            Subresource("log", ("get",), "Pod"),
            Subresource("portforward", ("create", "get"), "PodPortForwardOptions"),
            _status("Pod"),
        ),
    ),
    ResourceKind(
        "",
        "v1",
        "services",
        "Service",
        namespaced=True,
        short_names=("svc",),
        categories=("all",),
        verbs=("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"),
        subresources=(_status("Service"),),
    ),
    ResourceKind("", "v1", "configmaps", "ConfigMap", namespaced=True, short_names=("cm",)),
    ResourceKind("", "v1", "secrets", "Secret", namespaced=True),
    ResourceKind("", "v1", "events", "Event", namespaced=True, short_names=("ev",)),
    ResourceKind(
        "", "v1", "serviceaccounts", "ServiceAccount", namespaced=True, short_names=("sa",)
    ),
    ResourceKind(
        "apps",
        "v1",
        "deployments",
        "Deployment",
        namespaced=True,
        short_names=("deploy",),
        categories=("all",),
        subresources=(
            Subresource("scale", ("get", "patch", "update"), "Scale", "autoscaling", "v1"),
            _status("Deployment", "apps"),
        ),
    ),
    ResourceKind(
        "batch",
        "v1",
        "jobs",
        "Job",
        namespaced=True,
        categories=("all",),
        subresources=(_status("Job", "batch"),),
    ),
    ResourceKind(
        "authorization.k8s.io",
        "v1",
        "selfsubjectaccessreviews",
        "SelfSubjectAccessReview",
        namespaced=False,
        verbs=("create",),
    ),
    ResourceKind(
        "authorization.k8s.io",
        "v1",
        "selfsubjectrulesreviews",
        "SelfSubjectRulesReview",
        namespaced=False,
        verbs=("create",),
    ),
    ResourceKind(
        "authentication.k8s.io",
        "v1",
        "selfsubjectreviews",
        "SelfSubjectReview",
        namespaced=False,
        verbs=("create",),
    ),
    ResourceKind(
        "rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False
    ),
    ResourceKind("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True),
)
"""Every resource served, in discovery order."""

STORED_KINDS = frozenset(kind for kind in KINDS if "get" in kind.verbs)
"""The kinds kept in the store (the reviews are computed, never stored)."""


def find_kind(group: str, version: str, plural: str) -> ResourceKind | None:
    """The resource ``plural`` of ``group/version``, or None if it is not served."""
    for kind in KINDS:
        if kind.group == group and kind.version == version and kind.plural == plural:
            return kind
    return None


def require_kind(group: str, version: str, plural: str) -> ResourceKind:
    """The resource ``plural`` of ``group/version``; LookupError if it is not served."""
    kind = find_kind(group, version, plural)
    if kind is None:
        raise LookupError(f"{plural} in {group or 'core'}/{version} is not served")
    return kind


def group_versions() -> list[tuple[str, str]]:
    """Every (group, version) served, core first, in registry order."""
    seen: list[tuple[str, str]] = []
    for kind in KINDS:
        if kind.group_version not in seen:
            seen.append(kind.group_version)
    return seen


def kinds_in(group: str, version: str) -> list[ResourceKind]:
    """The resources of one group version, in registry order."""
    return [kind for kind in KINDS if kind.group == group and kind.version == version]
