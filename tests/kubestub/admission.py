"""What the API server (and the controllers kubectl users take for granted) do to an object.

:func:`prepare_create` and :func:`prepare_update` validate an incoming
object (422 Invalid, worded as the real validation words it), apply the
defaults the server applies, and stand in for the controllers a test cluster
would run: a pod is scheduled and running at once, a deployment reports its
replicas ready. Anything that needs the kubelet (exec, logs, port-forward)
therefore works on a pod as soon as it exists.
"""

from __future__ import annotations

import base64
import binascii
import copy
import re
import secrets
from datetime import UTC, datetime
from typing import Any

from tests.kubestub.kinds import ResourceKind
from tests.kubestub.status import bad_request, invalid
from tests.kubestub.store import now_rfc3339

__all__ = ["NODE_NAME", "prepare_create", "prepare_update", "with_status_of"]

NODE_NAME = "stub-node"
"""The one node every pod runs on."""

_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_LABEL_MESSAGE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and "
    "must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex "
    "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
_DNS1035_MESSAGE = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
    "alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or "
    "'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
)
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_ip_counter = [0]


def prepare_create(kind: ResourceKind, obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    """Validate and default an object for create in ``namespace`` ("" if cluster-scoped)."""
    obj = copy.deepcopy(obj)
    _check_type(kind, obj)
    meta = obj.setdefault("metadata", {})
    if not isinstance(meta, dict):
        raise bad_request("metadata must be an object")
    _check_namespace(kind, meta, namespace)
    if not meta.get("name") and meta.get("generateName"):
        suffix = "".join(secrets.choice(_GENERATE_ALPHABET) for _ in range(5))
        meta["name"] = f"{meta['generateName']}{suffix}"
    _validate_name(kind, meta.get("name") or "")
    obj["apiVersion"] = kind.api_version
    obj["kind"] = kind.kind
    _default(kind, obj)
    _validate(kind, obj)
    if "spec" in obj:
        meta["generation"] = 1
    _run_controllers(kind, obj)
    return obj


def prepare_update(
    kind: ResourceKind, obj: dict[str, Any], current: dict[str, Any], namespace: str
) -> dict[str, Any]:
    """Validate and default a replacement for ``current``."""
    obj = copy.deepcopy(obj)
    _check_type(kind, obj)
    meta = obj.setdefault("metadata", {})
    if not isinstance(meta, dict):
        raise bad_request("metadata must be an object")
    _check_namespace(kind, meta, namespace)
    _normalize(obj)
    name = current["metadata"]["name"]
    if meta.get("name", name) != name:
        raise bad_request(
            f"the name of the object ({meta.get('name')}) does not match the name on the URL "
            f"({name})"
        )
    meta["name"] = name
    obj["apiVersion"] = kind.api_version
    obj["kind"] = kind.kind
    _default(kind, obj)
    _validate(kind, obj)
    if kind.plural == "pods" and current.get("spec", {}).get("containers") is not None:
        _check_pod_immutable(kind, obj, current)
    generation = current["metadata"].get("generation")
    if isinstance(generation, int):
        # As the store will count it, so that controllers observe the new generation.
        meta["generation"] = generation + (1 if obj.get("spec") != current.get("spec") else 0)
    _run_controllers(kind, obj)
    return obj


_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")


def _normalize_times(value: Any) -> Any:
    """Timestamps re-encoded as the server writes them (UTC, seconds, ``Z``).

    Clients send back times in their own spelling (``+00:00``, fractions); the
    server parses them, so an unchanged object stays unchanged. Only metadata
    and status hold times: spec and data are never touched.
    """
    if isinstance(value, dict):
        return {k: _normalize_times(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normalize_times(item) for item in value]
    if isinstance(value, str) and _TIME.match(value):
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return value


def _normalize(obj: dict[str, Any]) -> None:
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        for field in ("creationTimestamp", "deletionTimestamp"):
            if field in meta:
                meta[field] = _normalize_times(meta[field])
        if isinstance(meta.get("managedFields"), list):
            for entry in meta["managedFields"]:
                if isinstance(entry, dict) and "time" in entry:
                    entry["time"] = _normalize_times(entry["time"])
    if "status" in obj:
        obj["status"] = _normalize_times(obj["status"])


def with_status_of(obj: dict[str, Any], source: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with the status of ``source``: a write to the main resource leaves status alone."""
    result = copy.deepcopy(obj)
    if "status" in source:
        result["status"] = copy.deepcopy(source["status"])
    else:
        result.pop("status", None)
    return result


def _check_type(kind: ResourceKind, obj: Any) -> None:
    if not isinstance(obj, dict):
        raise bad_request("the body of the request must be a JSON object")
    api_version = obj.get("apiVersion")
    if api_version is not None and api_version != kind.api_version:
        raise bad_request(
            f"the API version in the data ({api_version}) does not match the expected API "
            f"version ({kind.api_version})"
        )
    obj_kind = obj.get("kind")
    if obj_kind is not None and obj_kind != kind.kind:
        raise bad_request(
            f"the kind in the data ({obj_kind}) does not match the expected kind ({kind.kind})"
        )


def _check_namespace(kind: ResourceKind, meta: dict[str, Any], namespace: str) -> None:
    if not kind.namespaced:
        meta.pop("namespace", None)
        return
    if meta.get("namespace") not in (None, "", namespace):
        raise bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )
    meta["namespace"] = namespace


def _validate_name(kind: ResourceKind, name: str) -> None:
    if not name:
        raise invalid(
            kind,
            "",
            [
                (
                    "metadata.name",
                    "FieldValueRequired",
                    "Required value: name or generateName is required",
                )
            ],
        )
    if kind.plural == "services":
        pattern, message = _DNS1035, _DNS1035_MESSAGE
    elif kind.plural == "namespaces":
        pattern, message = _LABEL, _LABEL_MESSAGE
    else:
        pattern, message = _SUBDOMAIN, _SUBDOMAIN_MESSAGE
    limit = 63 if kind.plural in ("services", "namespaces") else 253
    if len(name) > limit:
        raise invalid(
            kind,
            name,
            [
                (
                    "metadata.name",
                    "FieldValueInvalid",
                    f'Invalid value: "{name}": must be no more than {limit} characters',
                )
            ],
        )
    if not pattern.match(name):
        raise invalid(
            kind,
            name,
            [("metadata.name", "FieldValueInvalid", f'Invalid value: "{name}": {message}')],
        )


def _validate(kind: ResourceKind, obj: dict[str, Any]) -> None:
    name = obj["metadata"]["name"]
    causes: list[tuple[str, str, str]] = []
    if kind.plural == "pods":
        causes += _pod_spec_causes(obj.get("spec"), "spec")
    elif kind.plural in ("deployments", "jobs"):
        spec = obj.get("spec") or {}
        template = spec.get("template") or {}
        causes += _pod_spec_causes(template.get("spec"), "spec.template.spec")
        if kind.plural == "deployments":
            selector = (spec.get("selector") or {}).get("matchLabels")
            labels = (template.get("metadata") or {}).get("labels") or {}
            if not spec.get("selector"):
                causes.append(("spec.selector", "FieldValueRequired", "Required value"))
            elif selector and any(labels.get(k) != v for k, v in selector.items()):
                causes.append(
                    (
                        "spec.template.metadata.labels",
                        "FieldValueInvalid",
                        f"Invalid value: {_go_map(labels)}: `selector` does not match template "
                        "`labels`",
                    )
                )
        else:
            policy = (template.get("spec") or {}).get("restartPolicy")
            if policy not in ("Never", "OnFailure"):
                causes.append(
                    (
                        "spec.template.spec.restartPolicy",
                        "FieldValueNotSupported",
                        f'Unsupported value: "{policy}": supported values: "OnFailure", "Never"',
                    )
                )
    elif kind.plural == "secrets":
        for key, value in (obj.get("data") or {}).items():
            try:
                base64.b64decode(str(value), validate=True)
            except (binascii.Error, ValueError) as exc:
                raise bad_request(
                    f'Secret in version "v1" cannot be handled as a Secret: illegal base64 data '
                    f"at input byte 0 (key {key!r})"
                ) from exc
    if causes:
        raise invalid(kind, name, causes)


def _pod_spec_causes(spec: Any, path: str) -> list[tuple[str, str, str]]:
    if not isinstance(spec, dict) or not spec.get("containers"):
        return [(f"{path}.containers", "FieldValueRequired", "Required value")]
    causes = []
    for index, container in enumerate(spec["containers"]):
        where = f"{path}.containers[{index}]"
        if not isinstance(container, dict) or not container.get("name"):
            causes.append((f"{where}.name", "FieldValueRequired", "Required value"))
        elif not container.get("image"):
            causes.append((f"{where}.image", "FieldValueRequired", "Required value"))
    return causes


def _check_pod_immutable(kind: ResourceKind, obj: dict[str, Any], current: dict[str, Any]) -> None:
    new_spec = copy.deepcopy(obj.get("spec") or {})
    old_spec = copy.deepcopy(current.get("spec") or {})
    # Images, activeDeadlineSeconds and tolerations may change; nothing else may.
    for spec in (new_spec, old_spec):
        for container in spec.get("containers", []):
            container.pop("image", None)
        spec.pop("activeDeadlineSeconds", None)
        spec.pop("tolerations", None)
    if new_spec != old_spec:
        raise invalid(
            kind,
            obj["metadata"]["name"],
            [
                (
                    "spec",
                    "FieldValueForbidden",
                    "Forbidden: pod updates may not change fields other than `spec.containers[*]."
                    "image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,"
                    "`spec.tolerations` (only additions to existing tolerations),"
                    "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was "
                    "previously negative)",
                )
            ],
        )


def _go_map(labels: dict[str, Any]) -> str:
    inner = ", ".join(f'"{k}":"{v}"' for k, v in sorted(labels.items()))
    return "map[string]string{" + inner + "}"


def _default(kind: ResourceKind, obj: dict[str, Any]) -> None:
    if kind.plural == "pods":
        _default_pod_spec(obj.setdefault("spec", {}))
    elif kind.plural == "deployments":
        spec = obj.setdefault("spec", {})
        spec.setdefault("replicas", 1)
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault("progressDeadlineSeconds", 600)
        spec.setdefault(
            "strategy",
            {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"},
            },
        )
        _default_pod_spec(spec.setdefault("template", {}).setdefault("spec", {}))
    elif kind.plural == "jobs":
        spec = obj.setdefault("spec", {})
        for field, value in (
            ("completions", 1),
            ("parallelism", 1),
            ("backoffLimit", 6),
            ("completionMode", "NonIndexed"),
            ("suspend", False),
        ):
            spec.setdefault(field, value)
        _default_pod_spec(spec.setdefault("template", {}).setdefault("spec", {}))
    elif kind.plural == "secrets":
        obj.setdefault("type", "Opaque")
        string_data = obj.pop("stringData", None) or {}
        data = obj.setdefault("data", {}) if string_data else obj.get("data")
        for key, value in string_data.items():
            assert data is not None
            data[key] = base64.b64encode(str(value).encode()).decode()
    elif kind.plural == "services":
        _default_service(obj.setdefault("spec", {}))
    elif kind.plural == "namespaces":
        meta = obj["metadata"]
        meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta["name"]
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])


def _default_pod_spec(spec: dict[str, Any]) -> None:
    for field, value in (
        ("restartPolicy", "Always"),
        ("terminationGracePeriodSeconds", 30),
        ("dnsPolicy", "ClusterFirst"),
        ("serviceAccountName", "default"),
        ("securityContext", {}),
        ("schedulerName", "default-scheduler"),
        ("enableServiceLinks", True),
        ("priority", 0),
        ("preemptionPolicy", "PreemptLowerPriority"),
    ):
        spec.setdefault(field, value)
    spec.setdefault("serviceAccount", spec["serviceAccountName"])
    for container in spec.get("containers") or []:
        if not isinstance(container, dict):
            continue
        image = str(container.get("image", ""))
        tag = image.rsplit("/", 1)[-1]
        latest = ":" not in tag or tag.endswith(":latest")
        container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        container.setdefault("resources", {})
        for port in container.get("ports") or []:
            if isinstance(port, dict):
                port.setdefault("protocol", "TCP")


def _default_service(spec: dict[str, Any]) -> None:
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    if spec["type"] != "ExternalName" and "clusterIP" not in spec:
        _ip_counter[0] += 1
        spec["clusterIP"] = f"10.96.{_ip_counter[0] // 250}.{_ip_counter[0] % 250 + 2}"
    if "clusterIP" in spec:
        spec.setdefault("clusterIPs", [spec["clusterIP"]])
    spec.setdefault("ipFamilies", ["IPv4"])
    spec.setdefault("ipFamilyPolicy", "SingleStack")
    spec.setdefault("internalTrafficPolicy", "Cluster")
    for port in spec.get("ports") or []:
        if isinstance(port, dict):
            port.setdefault("protocol", "TCP")
            if "port" in port:
                port.setdefault("targetPort", port["port"])


def _run_controllers(kind: ResourceKind, obj: dict[str, Any]) -> None:
    """Fill the status a scheduler, kubelet or controller would soon write."""
    if kind.plural == "pods" and not obj.get("status", {}).get("phase"):
        obj["status"] = _running_pod_status(obj)
        obj["spec"].setdefault("nodeName", NODE_NAME)
    elif kind.plural == "deployments":
        replicas = obj["spec"]["replicas"]
        generation = obj["metadata"].get("generation", 1)
        obj["status"] = {
            "observedGeneration": generation,
            "replicas": replicas,
            "updatedReplicas": replicas,
            "readyReplicas": replicas,
            "availableReplicas": replicas,
            "conditions": [
                _condition(
                    "Available", "MinimumReplicasAvailable", "Deployment has minimum availability."
                ),
                _condition(
                    "Progressing",
                    "NewReplicaSetAvailable",
                    f'ReplicaSet "{obj["metadata"]["name"]}-stub" has successfully progressed.',
                ),
            ],
        }
        if replicas == 0:
            for field in ("readyReplicas", "availableReplicas", "updatedReplicas"):
                obj["status"].pop(field)
    elif kind.plural == "namespaces":
        obj.setdefault("status", {}).setdefault("phase", "Active")
    elif kind.plural == "services":
        obj.setdefault("status", {}).setdefault("loadBalancer", {})
    elif kind.plural == "jobs" and "status" not in obj:
        obj["status"] = {"active": 1, "ready": 1, "startTime": now_rfc3339(), "terminating": 0}


def _condition(kind: str, reason: str, message: str) -> dict[str, Any]:
    now = now_rfc3339()
    return {
        "type": kind,
        "status": "True",
        "lastUpdateTime": now,
        "lastTransitionTime": now,
        "reason": reason,
        "message": message,
    }


def _running_pod_status(obj: dict[str, Any]) -> dict[str, Any]:
    now = now_rfc3339()
    _ip_counter[0] += 1
    pod_ip = f"10.244.{_ip_counter[0] // 250}.{_ip_counter[0] % 250 + 2}"
    statuses = []
    for container in obj["spec"].get("containers") or []:
        statuses.append(
            {
                "name": container.get("name"),
                "state": {"running": {"startedAt": now}},
                "lastState": {},
                "ready": True,
                "restartCount": 0,
                "image": container.get("image"),
                "imageID": f"docker.io/library/{container.get('image')}@sha256:{'0' * 64}",
                "containerID": f"containerd://{secrets.token_hex(32)}",
                "started": True,
            }
        )
    conditions = [
        {"type": kind, "status": "True", "lastProbeTime": None, "lastTransitionTime": now}
        for kind in (
            "PodReadyToStartContainers",
            "Initialized",
            "Ready",
            "ContainersReady",
            "PodScheduled",
        )
    ]
    return {
        "phase": "Running",
        "conditions": conditions,
        "hostIP": "10.0.0.10",
        "hostIPs": [{"ip": "10.0.0.10"}],
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": now,
        "containerStatuses": statuses,
        "qosClass": "BestEffort",
    }
