"""The agent's install manifest, rendered for one cluster.

The manifest pins this server: its URL and CA bundle travel in the bootstrap
Secret together with the one-time token, so the agent never trusts another
server and never needs inbound access.
"""

from __future__ import annotations

from typing import Any

import yaml

__all__ = ["AGENT_NAMESPACE", "render_agent_manifest"]

AGENT_NAMESPACE = "tunnel-agent"
_NAME = "tunnel-agent"
_LABELS = {"app.kubernetes.io/name": _NAME, "app.kubernetes.io/part-of": "k8s-reverse-tunnel"}


def render_agent_manifest(
    *,
    cluster: str,
    server_url: str,
    ca_pem: str,
    bootstrap_token: str,
    image: str,
    namespace: str = AGENT_NAMESPACE,
) -> str:
    """The multi-document YAML that installs the agent of ``cluster``."""
    documents = [
        _object("v1", "Namespace", namespace, None),
        _object("v1", "ServiceAccount", _NAME, namespace),
        _object(
            "v1",
            "Secret",
            f"{_NAME}-bootstrap",
            namespace,
            type="Opaque",
            stringData={
                "server-url": server_url,
                "ca.crt": ca_pem,
                "cluster": cluster,
                "bootstrap-token": bootstrap_token,
            },
        ),
        _object(
            "rbac.authorization.k8s.io/v1",
            "Role",
            _NAME,
            namespace,
            rules=[
                {
                    "apiGroups": [""],
                    "resources": ["secrets"],
                    "verbs": ["create"],
                },
                {
                    "apiGroups": [""],
                    "resources": ["secrets"],
                    "resourceNames": [f"{_NAME}-credentials"],
                    "verbs": ["get", "update", "patch"],
                },
            ],
        ),
        _binding("RoleBinding", "Role", namespace),
        _object(
            "rbac.authorization.k8s.io/v1",
            "ClusterRole",
            _NAME,
            None,
            rules=[
                {
                    "apiGroups": [""],
                    "resources": ["users", "groups"],
                    "verbs": ["impersonate"],
                },
            ],
        ),
        _binding("ClusterRoleBinding", "ClusterRole", namespace),
        _deployment(image, namespace),
    ]
    return "---\n".join(yaml.safe_dump(doc, sort_keys=False) for doc in documents)


def _object(
    api_version: str, kind: str, name: str, namespace: str | None, **fields: Any
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": dict(_LABELS)}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {"apiVersion": api_version, "kind": kind, "metadata": metadata, **fields}


def _binding(kind: str, role_kind: str, namespace: str) -> dict[str, Any]:
    return _object(
        "rbac.authorization.k8s.io/v1",
        kind,
        _NAME,
        namespace if kind == "RoleBinding" else None,
        roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": _NAME},
        subjects=[{"kind": "ServiceAccount", "name": _NAME, "namespace": namespace}],
    )


def _deployment(image: str, namespace: str) -> dict[str, Any]:
    bootstrap = f"{_NAME}-bootstrap"
    env = [
        {"name": "TUNNEL_AGENT_SERVER", "valueFrom": _secret_key(bootstrap, "server-url")},
        {"name": "TUNNEL_AGENT_CLUSTER", "valueFrom": _secret_key(bootstrap, "cluster")},
        {"name": "TUNNEL_AGENT_CA", "value": "/etc/tunnel-agent/ca.crt"},
        {"name": "TUNNEL_AGENT_BOOTSTRAP_TOKEN_FILE", "value": "/etc/tunnel-agent/bootstrap-token"},
        {"name": "TUNNEL_AGENT_CREDENTIALS_SECRET", "value": f"{namespace}/{_NAME}-credentials"},
        {"name": "TUNNEL_AGENT_HEALTH_LISTEN", "value": "0.0.0.0:8081"},
    ]
    container = {
        "name": "agent",
        "image": image,
        "args": ["run"],
        "env": env,
        "ports": [{"name": "health", "containerPort": 8081}],
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "health"}},
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "health"}},
        "resources": {
            "requests": {"cpu": "50m", "memory": "64Mi"},
            "limits": {"memory": "256Mi"},
        },
        "securityContext": {
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [
            {"name": "bootstrap", "mountPath": "/etc/tunnel-agent", "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},  # noqa: S108 - an emptyDir
        ],
    }
    return _object(
        "apps/v1",
        "Deployment",
        _NAME,
        namespace,
        spec={
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {"app.kubernetes.io/name": _NAME}},
            "template": {
                "metadata": {"labels": dict(_LABELS)},
                "spec": {
                    "serviceAccountName": _NAME,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 65532},
                    "containers": [container],
                    "volumes": [
                        {"name": "bootstrap", "secret": {"secretName": bootstrap}},
                        {"name": "tmp", "emptyDir": {}},
                    ],
                },
            },
        },
    )


def _secret_key(name: str, key: str) -> dict[str, Any]:
    return {"secretKeyRef": {"name": name, "key": key}}
