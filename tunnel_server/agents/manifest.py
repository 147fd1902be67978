"""The agent's install manifest, rendered for one cluster.

The manifest pins this server: its URL and CA bundle travel in the bootstrap
Secret together with the one-time token, so the agent never trusts another
server and never needs inbound access.

It is rendered from the kustomize files shipped in ``tunnel_server/manifests``
(the ones ``manifests/agent/*`` build with ``kubectl kustomize``), the way
kustomize builds them, so ``tunnelctl cluster add`` and kustomize never
drift: the overlay of the RBAC variant; for the namespaced variant one copy
of ``agent/namespace-access`` per namespace; an ``AgentValues`` object made
of the arguments; then the replacements of the ``cluster-values`` component
(and ``namespaces``). Values are set in the parsed objects, never by editing
YAML text.

Only the kustomize features those files use are implemented (``resources``,
``components``, inline JSON patches, and replacements with ``[key]``,
``[name=value]`` and index path segments and the ``delimiter``/``index``
options); anything else raises :class:`ManifestError`, and a test builds the
same variants with the real kustomize and compares the objects.
"""

from __future__ import annotations

import copy
import posixpath
import re
from collections.abc import Iterator, Sequence
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any
from urllib.parse import urlsplit

import yaml

from tunnel_pki.errors import PkiError
from tunnel_pki.names import validate_cluster_name
from tunnel_server.errors import ServerError

__all__ = [
    "AGENT_NAMESPACE",
    "RBAC_VARIANTS",
    "ManifestError",
    "render_agent_manifest",
    "unservable",
]

AGENT_NAMESPACE = "tunnel-agent"
#: The RBAC variants, each an overlay in ``manifests/agent/overlays``.
RBAC_VARIANTS = ("full", "read-only", "namespaced")

_LOCAL_CONFIG = "config.kubernetes.io/local-config"
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_KUSTOMIZATION_KEYS = frozenset(
    {"apiVersion", "kind", "resources", "components", "patches", "replacements"}
)
#: kustomize's default ("legacy") output order; other kinds go in between.
_ORDER_FIRST = (
    "Namespace", "ResourceQuota", "StorageClass", "CustomResourceDefinition", "ServiceAccount",
    "PodSecurityPolicy", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding", "ConfigMap",
    "Secret", "Endpoints", "Service", "LimitRange", "PriorityClass", "PersistentVolume",
    "PersistentVolumeClaim", "Deployment", "StatefulSet", "CronJob", "PodDisruptionBudget",
)  # fmt: skip
_ORDER_LAST = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


class ManifestError(ServerError):
    """The install manifest cannot be rendered: an argument or a packaged file is unusable."""


def unservable(name: str, agent_namespace: str = AGENT_NAMESPACE) -> str | None:
    """Why a namespaced agent may not serve namespace ``name``, if it may not.

    Its own namespace holds its credentials and tokens; kube-system, the
    cluster's own controllers and their tokens. Rights in either reach past
    any list of namespaces.
    """
    if name == agent_namespace:
        return f"namespace {name} is the agent's own: a namespaced agent may not serve it"
    if name == "kube-system":
        return "kube-system holds the cluster's controllers: a namespaced agent may not serve it"
    return None


def render_agent_manifest(
    *,
    cluster: str,
    server_url: str,
    ca_pem: str,
    bootstrap_token: str,
    image: str,
    namespace: str = AGENT_NAMESPACE,
    rbac: str = "full",
    namespaces: tuple[str, ...] = (),
) -> str:
    """The multi-document YAML that installs the agent of ``cluster``.

    ``rbac`` picks the variant (:data:`RBAC_VARIANTS`); ``namespaces`` are
    the namespaces of the ``namespaced`` variant (required there, refused
    elsewhere).
    """
    if rbac not in RBAC_VARIANTS:
        raise ManifestError(f"rbac must be one of {', '.join(RBAC_VARIANTS)}, not {rbac!r}")
    if rbac == "namespaced" and not namespaces:
        raise ManifestError("the namespaced variant needs at least one namespace")
    if rbac != "namespaced" and namespaces:
        raise ManifestError(f"namespaces apply to the namespaced variant only, not {rbac!r}")
    values = _agent_values(
        cluster=cluster,
        server_url=server_url,
        ca_pem=ca_pem,
        bootstrap_token=bootstrap_token,
        image=image,
        namespace=namespace,
        namespaces=namespaces,
    )
    objects = _build_kustomization(f"agent/overlays/{rbac}")
    for name in namespaces:
        # What kustomize's namespace transformer does to these two objects
        # (it leaves the RoleBinding's subject alone: its namespace is not
        # "default").
        for obj in _build_kustomization("agent/namespace-access"):
            obj["metadata"]["namespace"] = name
            objects.append(obj)
    objects.append(values)
    components = ["agent/components/cluster-values"]
    if rbac == "namespaced":
        components.append("agent/components/namespaces")
    for component in components:
        objects = _apply_component(component, objects)
    return _dump_objects(_sorted(_without_local_config(objects)))


def _agent_values(
    *,
    cluster: str,
    server_url: str,
    ca_pem: str,
    bootstrap_token: str,
    image: str,
    namespace: str = AGENT_NAMESPACE,
    namespaces: Sequence[str] = (),
) -> dict[str, Any]:
    """The ``AgentValues`` object the cluster-values component reads, validated."""
    try:
        cluster = validate_cluster_name(cluster)
    except PkiError as exc:
        raise ManifestError(str(exc)) from exc
    _require_label(namespace, "namespace")
    if len(set(namespaces)) != len(namespaces):
        raise ManifestError("namespaces must not repeat")
    for name in namespaces:
        _require_label(name, "namespaces")
        reason = unservable(name, namespace)
        if reason is not None:
            raise ManifestError(reason)
    if "-----BEGIN CERTIFICATE-----" not in ca_pem:
        raise ManifestError("the CA bundle must hold PEM certificates")
    for what, text in (("bootstrap token", bootstrap_token), ("image", image)):
        if not text or any(character.isspace() for character in text):
            raise ManifestError(f"the {what} must be non-empty, without spaces")
    spec: dict[str, Any] = {
        "cluster": cluster,
        "serverUrl": server_url,
        "serverPort": _server_port(server_url),
        "caBundle": ca_pem,
        "bootstrapToken": bootstrap_token,
        "image": image,
        "namespace": namespace,
    }
    if namespaces:
        spec["namespaces"] = ",".join(namespaces)
    return {
        "apiVersion": "kustomize.k8s-reverse-tunnel/v1",
        "kind": "AgentValues",
        "metadata": {"name": "tunnel-agent-values", "annotations": {_LOCAL_CONFIG: "true"}},
        "spec": spec,
    }


def _require_label(name: str, what: str) -> None:
    if not _DNS_LABEL.fullmatch(name):
        raise ManifestError(
            f"{what}: {name[:70]!r} is not a namespace name (lower-case letters, digits "
            "and '-', at most 63)"
        )


def _server_port(server_url: str) -> int:
    try:
        parts = urlsplit(server_url)
        port = parts.port
    except ValueError as exc:
        raise ManifestError(f"the server URL is not a URL: {exc}") from exc
    if parts.username is not None or parts.query or parts.fragment:
        raise ManifestError("the server URL must not hold credentials, a query or a fragment")
    if parts.scheme != "https" or not parts.hostname:
        raise ManifestError(f"the server URL must be https://HOST[:PORT], not {server_url[:100]!r}")
    return 443 if port is None else port


# --- a small kustomize -------------------------------------------------------


def _build_kustomization(directory: str) -> list[dict[str, Any]]:
    """The objects the kustomization in ``directory`` (under ``manifests/``) builds."""
    kustomization = _kustomization(directory, "Kustomization")
    objects: list[dict[str, Any]] = []
    for reference in _string_list(kustomization, "resources", directory):
        path = _join(directory, reference)
        if _file(path).is_dir():
            objects.extend(_build_kustomization(path))
        else:
            objects.extend(_objects(path))
    for reference in _string_list(kustomization, "components", directory):
        objects = _apply_component(_join(directory, reference), objects)
    _transform(kustomization, directory, objects)
    return objects


def _apply_component(directory: str, objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    component = _kustomization(directory, "Component")
    objects = list(objects)
    for reference in _string_list(component, "resources", directory):
        objects.extend(_objects(_join(directory, reference)))
    if component.get("components"):
        raise ManifestError(f"{directory}: components within components are not supported")
    _transform(component, directory, objects)
    return objects


def _transform(kustomization: dict[str, Any], where: str, objects: list[dict[str, Any]]) -> None:
    for patch in _list(kustomization, "patches", where):
        _apply_patch(patch, where, objects)
    for replacement in _list(kustomization, "replacements", where):
        _apply_replacement(replacement, where, objects)


def _kustomization(directory: str, kind: str) -> dict[str, Any]:
    documents = _documents(f"{directory}/kustomization.yaml")
    if len(documents) != 1 or not isinstance(documents[0], dict):
        raise ManifestError(f"{directory}/kustomization.yaml must hold one mapping")
    kustomization: dict[str, Any] = documents[0]
    if kustomization.get("kind", "Kustomization") != kind:
        raise ManifestError(f"{directory}/kustomization.yaml must be a {kind}")
    unknown = set(kustomization) - _KUSTOMIZATION_KEYS
    if unknown:
        raise ManifestError(
            f"{directory}/kustomization.yaml uses {', '.join(sorted(unknown))}, "
            "which tunnel_server/agents/manifest.py does not implement"
        )
    return kustomization


def _objects(path: str) -> list[dict[str, Any]]:
    objects = []
    for document in _documents(path):
        if not isinstance(document, dict) or not isinstance(document.get("metadata"), dict):
            raise ManifestError(f"{path}: every document must be an object with metadata")
        objects.append(document)
    return objects


def _documents(path: str) -> list[Any]:
    try:
        text = _file(path).read_text(encoding="utf-8")
        return [document for document in yaml.safe_load_all(text) if document is not None]
    except (OSError, yaml.YAMLError) as exc:
        raise ManifestError(f"cannot read the packaged manifest {path}: {exc}") from exc


def _file(path: str) -> Traversable:
    return resources.files("tunnel_server").joinpath("manifests", *path.split("/"))


def _join(directory: str, reference: str) -> str:
    path = posixpath.normpath(posixpath.join(directory, reference))
    if posixpath.isabs(reference) or path == ".." or path.startswith("../"):
        raise ManifestError(f"{directory}: {reference!r} points outside the packaged manifests")
    return path


def _list(mapping: dict[str, Any], key: str, where: str) -> list[Any]:
    value = mapping.get(key) or []
    if not isinstance(value, list):
        raise ManifestError(f"{where}: {key} must be a list")
    return value


def _string_list(mapping: dict[str, Any], key: str, where: str) -> list[str]:
    value = _list(mapping, key, where)
    if not all(isinstance(item, str) for item in value):
        raise ManifestError(f"{where}: {key} must list paths")
    return value


def _selected(obj: dict[str, Any], select: Any, where: str) -> bool:
    if not isinstance(select, dict) or not set(select) <= {"kind", "name", "namespace"}:
        raise ManifestError(f"{where}: a selector may use kind, name and namespace only")
    metadata = obj["metadata"]
    actual = {"kind": obj.get("kind"), "name": metadata.get("name")}
    actual["namespace"] = metadata.get("namespace")
    return all(actual[key] == value for key, value in select.items())


def _apply_patch(patch: Any, where: str, objects: list[dict[str, Any]]) -> None:
    if not isinstance(patch, dict) or set(patch) != {"target", "patch"}:
        raise ManifestError(f"{where}: a patch must be an inline patch with a target")
    operations = yaml.safe_load(patch["patch"])
    if not isinstance(operations, list):
        raise ManifestError(f"{where}: only JSON patches (lists of operations) are supported")
    targets = [obj for obj in objects if _selected(obj, patch["target"], where)]
    if not targets:
        raise ManifestError(f"{where}: no object matches the patch target {patch['target']}")
    for obj in targets:
        for operation in operations:
            _json_patch(obj, operation, where)


def _json_patch(obj: dict[str, Any], operation: Any, where: str) -> None:
    """One RFC 6902 add, replace or remove operation."""
    if not isinstance(operation, dict) or operation.get("op") not in {"add", "replace", "remove"}:
        raise ManifestError(f"{where}: JSON patch operations may be add, replace or remove")
    pointer = str(operation.get("path", ""))
    if not pointer.startswith("/"):
        raise ManifestError(f"{where}: JSON patch path {pointer!r} must start with /")
    tokens = [token.replace("~1", "/").replace("~0", "~") for token in pointer[1:].split("/")]
    parent: Any = obj
    for token in tokens[:-1]:
        parent = _step_pointer(parent, token, pointer, where)
    last = tokens[-1]
    op = operation["op"]
    if isinstance(parent, list):
        index = len(parent) if last == "-" and op == "add" else _list_index(parent, last, op)
        if op == "add":
            parent.insert(index, copy.deepcopy(operation["value"]))
        elif op == "replace":
            parent[index] = copy.deepcopy(operation["value"])
        else:
            del parent[index]
    elif isinstance(parent, dict):
        if op != "add" and last not in parent:
            raise ManifestError(f"{where}: JSON patch path {pointer} does not exist")
        if op == "remove":
            del parent[last]
        else:
            parent[last] = copy.deepcopy(operation["value"])
    else:
        raise ManifestError(f"{where}: JSON patch path {pointer} does not exist")


def _step_pointer(node: Any, token: str, pointer: str, where: str) -> Any:
    if isinstance(node, dict) and token in node:
        return node[token]
    if isinstance(node, list) and token.isdigit() and int(token) < len(node):
        return node[int(token)]
    raise ManifestError(f"{where}: JSON patch path {pointer} does not exist")


def _list_index(items: list[Any], token: str, op: str) -> int:
    limit = len(items) + (1 if op == "add" else 0)
    if not token.isdigit() or int(token) >= limit:
        raise ManifestError(f"JSON patch index {token!r} is out of range")
    return int(token)


def _apply_replacement(replacement: Any, where: str, objects: list[dict[str, Any]]) -> None:
    if not isinstance(replacement, dict) or set(replacement) != {"source", "targets"}:
        raise ManifestError(f"{where}: a replacement must have a source and targets only")
    source = dict(replacement["source"])
    field_path = source.pop("fieldPath", None)
    if not isinstance(field_path, str):
        raise ManifestError(f"{where}: a replacement source needs a fieldPath")
    sources = [obj for obj in objects if _selected(obj, source, where)]
    if len(sources) != 1:
        raise ManifestError(f"{where}: {len(sources)} objects match the source {source}")
    value = _get(sources[0], field_path)
    for target in replacement["targets"]:
        if not isinstance(target, dict) or not set(target) <= {"select", "fieldPaths", "options"}:
            raise ManifestError(f"{where}: a target may have select, fieldPaths and options only")
        options = target.get("options") or {}
        if not set(options) <= {"delimiter", "index"}:
            raise ManifestError(f"{where}: target options may be delimiter and index only")
        selected = [obj for obj in objects if _selected(obj, target["select"], where)]
        if not selected:
            raise ManifestError(f"{where}: no object matches the target {target['select']}")
        for obj in selected:
            for path in target["fieldPaths"]:
                _set(obj, path, value, options)


def _segments(path: str) -> Iterator[str]:
    """kustomize's field path: dot-separated, a [bracketed] segment may hold dots."""
    position = 0
    while position < len(path):
        if path[position] == "[":
            end = path.find("]", position)
            if end < 0:
                raise ManifestError(f"unbalanced [ in the field path {path!r}")
            yield path[position : end + 1]
            position = end + 1
        else:
            end = path.find(".", position)
            end = len(path) if end < 0 else end
            yield path[position:end]
            position = end
        if position < len(path):
            if path[position] != ".":
                raise ManifestError(f"expected . after ] in the field path {path!r}")
            position += 1


def _step(node: Any, segment: str, obj: dict[str, Any], path: str) -> tuple[Any, Any]:
    """The container and key or index that ``segment`` names within ``node``."""
    if segment.startswith("[") and "=" in segment:
        key, _, wanted = segment[1:-1].partition("=")
        if isinstance(node, list):
            for index, item in enumerate(node):
                if isinstance(item, dict) and item.get(key) == wanted:
                    return node, index
    elif isinstance(node, list):
        if segment.isdigit() and int(segment) < len(node):
            return node, int(segment)
    elif isinstance(node, dict):
        key = segment[1:-1] if segment.startswith("[") else segment
        if key in node:
            return node, key
    metadata = obj["metadata"]
    raise ManifestError(f"{path} is not found in {obj.get('kind')} {metadata.get('name')}")


def _get(obj: dict[str, Any], path: str) -> Any:
    node: Any = obj
    for segment in _segments(path):
        container, key = _step(node, segment, obj, path)
        node = container[key]
    return copy.deepcopy(node)


def _set(obj: dict[str, Any], path: str, value: Any, options: dict[str, Any]) -> None:
    node: Any = obj
    container: Any = None
    key: Any = None
    for segment in _segments(path):
        container, key = _step(node, segment, obj, path)
        node = container[key]
    if "delimiter" in options:
        parts = str(node).split(str(options["delimiter"]))
        index = int(options.get("index", 0))
        if not 0 <= index < len(parts):
            raise ManifestError(f"{path}: index {index} is out of range")
        parts[index] = str(value)
        value = str(options["delimiter"]).join(parts)
    container[key] = copy.deepcopy(value)


def _without_local_config(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def local(obj: dict[str, Any]) -> bool:
        annotations = obj["metadata"].get("annotations") or {}
        return str(annotations.get(_LOCAL_CONFIG, "")).lower() == "true"

    return [obj for obj in objects if not local(obj)]


def _sorted(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """In kustomize's default order: by kind (namespaces first), then namespace and name."""

    def key(obj: dict[str, Any]) -> tuple[int, str, str]:
        kind = str(obj.get("kind"))
        if kind in _ORDER_FIRST:
            rank = _ORDER_FIRST.index(kind)
        elif kind in _ORDER_LAST:
            rank = len(_ORDER_FIRST) + 1 + _ORDER_LAST.index(kind)
        else:
            rank = len(_ORDER_FIRST)
        metadata = obj["metadata"]
        gvk = f"{obj.get('apiVersion')}/{kind}"
        # kustomize compares "namespace|name" as one string.
        return rank, gvk, f"{metadata.get('namespace') or ''}|{metadata.get('name')}"

    return sorted(objects, key=key)


class _Dumper(yaml.SafeDumper):
    """Block style; multi-line strings (the CA bundle) as literal blocks."""


def _represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _represent_str)


def _dump_objects(objects: list[dict[str, Any]]) -> str:
    """Objects as multi-document YAML, keys in their given order."""
    return "---\n".join(
        yaml.dump(obj, Dumper=_Dumper, sort_keys=False, default_flow_style=False) for obj in objects
    )
