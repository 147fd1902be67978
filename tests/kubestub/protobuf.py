"""Decoding the Kubernetes protobuf request bodies kubectl 1.32's typed clients send.

kubectl's typed clients (``create configmap|secret|namespace|serviceaccount|
deployment|job|service``, ``run``, ``auth can-i``, ``auth whoami``) POST
``application/vnd.kubernetes.protobuf`` bodies: the magic ``k8s\\0`` and a
``runtime.Unknown`` whose ``raw`` field is the object in the generated
protobuf encoding. This module decodes those into the JSON form the rest of
the stand-in uses, from a field table covering the types those commands
produce (the numbers are the ``generated.proto`` tags of k8s.io/api). Fields
outside the table are skipped. Responses are always JSON, which those
clients accept too.

Go's generated marshalling writes every non-pointer field, empty or not, so
empty strings, zero numbers, false, empty lists, maps and messages are
dropped, as ``omitempty`` drops them from JSON.
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Any

from tests.kubestub.status import bad_request

__all__ = ["PROTOBUF", "decode_object"]

PROTOBUF = "application/vnd.kubernetes.protobuf"
_MAGIC = b"k8s\x00"

STR, INT, BOOL, BYTES = "string", "int", "bool", "bytes"
Field = tuple[str, str, str]  # json name, type (scalar or message), "" | "repeated" | "map"

_SCHEMAS: dict[str, dict[int, Field]] = {
    "Unknown": {
        1: ("typeMeta", "TypeMeta", ""),
        2: ("raw", BYTES, ""),
        3: ("contentEncoding", STR, ""),
        4: ("contentType", STR, ""),
    },
    "TypeMeta": {1: ("apiVersion", STR, ""), 2: ("kind", STR, "")},
    "ObjectMeta": {
        1: ("name", STR, ""),
        2: ("generateName", STR, ""),
        3: ("namespace", STR, ""),
        5: ("uid", STR, ""),
        6: ("resourceVersion", STR, ""),
        7: ("generation", INT, ""),
        8: ("creationTimestamp", "Time", ""),
        10: ("deletionGracePeriodSeconds", INT, ""),
        11: ("labels", STR, "map"),
        12: ("annotations", STR, "map"),
        13: ("ownerReferences", "OwnerReference", "repeated"),
        14: ("finalizers", STR, "repeated"),
    },
    "OwnerReference": {
        1: ("kind", STR, ""),
        3: ("name", STR, ""),
        4: ("uid", STR, ""),
        5: ("apiVersion", STR, ""),
        6: ("controller", BOOL, ""),
        7: ("blockOwnerDeletion", BOOL, ""),
    },
    "LabelSelector": {
        1: ("matchLabels", STR, "map"),
        2: ("matchExpressions", "LabelSelectorRequirement", "repeated"),
    },
    "LabelSelectorRequirement": {
        1: ("key", STR, ""),
        2: ("operator", STR, ""),
        3: ("values", STR, "repeated"),
    },
    "ConfigMap": {
        1: ("metadata", "ObjectMeta", ""),
        2: ("data", STR, "map"),
        3: ("binaryData", BYTES, "map"),
        4: ("immutable", BOOL, ""),
    },
    "Secret": {
        1: ("metadata", "ObjectMeta", ""),
        2: ("data", BYTES, "map"),
        3: ("type", STR, ""),
        4: ("stringData", STR, "map"),
        5: ("immutable", BOOL, ""),
    },
    "Namespace": {
        1: ("metadata", "ObjectMeta", ""),
        2: ("spec", "NamespaceSpec", ""),
        3: ("status", "NamespaceStatus", ""),
    },
    "NamespaceSpec": {1: ("finalizers", STR, "repeated")},
    "NamespaceStatus": {1: ("phase", STR, "")},
    "ServiceAccount": {
        1: ("metadata", "ObjectMeta", ""),
        2: ("secrets", "ObjectReference", "repeated"),
        3: ("imagePullSecrets", "LocalObjectReference", "repeated"),
        4: ("automountServiceAccountToken", BOOL, ""),
    },
    "ObjectReference": {
        1: ("kind", STR, ""),
        2: ("namespace", STR, ""),
        3: ("name", STR, ""),
        4: ("uid", STR, ""),
        5: ("apiVersion", STR, ""),
        6: ("resourceVersion", STR, ""),
        7: ("fieldPath", STR, ""),
    },
    "LocalObjectReference": {1: ("name", STR, "")},
    "Pod": {
        1: ("metadata", "ObjectMeta", ""),
        2: ("spec", "PodSpec", ""),
        3: ("status", "PodStatus", ""),
    },
    "PodStatus": {1: ("phase", STR, "")},
    "PodTemplateSpec": {1: ("metadata", "ObjectMeta", ""), 2: ("spec", "PodSpec", "")},
    "PodSpec": {
        2: ("containers", "Container", "repeated"),
        3: ("restartPolicy", STR, ""),
        4: ("terminationGracePeriodSeconds", INT, ""),
        5: ("activeDeadlineSeconds", INT, ""),
        6: ("dnsPolicy", STR, ""),
        7: ("nodeSelector", STR, "map"),
        8: ("serviceAccountName", STR, ""),
        9: ("serviceAccount", STR, ""),
        10: ("nodeName", STR, ""),
        11: ("hostNetwork", BOOL, ""),
        15: ("imagePullSecrets", "LocalObjectReference", "repeated"),
        16: ("hostname", STR, ""),
        17: ("subdomain", STR, ""),
        19: ("schedulerName", STR, ""),
        20: ("initContainers", "Container", "repeated"),
        21: ("automountServiceAccountToken", BOOL, ""),
        24: ("priorityClassName", STR, ""),
        25: ("priority", INT, ""),
        30: ("enableServiceLinks", BOOL, ""),
    },
    "Container": {
        1: ("name", STR, ""),
        2: ("image", STR, ""),
        3: ("command", STR, "repeated"),
        4: ("args", STR, "repeated"),
        5: ("workingDir", STR, ""),
        6: ("ports", "ContainerPort", "repeated"),
        7: ("env", "EnvVar", "repeated"),
        8: ("resources", "ResourceRequirements", ""),
        13: ("terminationMessagePath", STR, ""),
        14: ("imagePullPolicy", STR, ""),
        16: ("stdin", BOOL, ""),
        17: ("stdinOnce", BOOL, ""),
        18: ("tty", BOOL, ""),
        20: ("terminationMessagePolicy", STR, ""),
    },
    "ContainerPort": {
        1: ("name", STR, ""),
        2: ("hostPort", INT, ""),
        3: ("containerPort", INT, ""),
        4: ("protocol", STR, ""),
        5: ("hostIP", STR, ""),
    },
    "EnvVar": {1: ("name", STR, ""), 2: ("value", STR, "")},
    "ResourceRequirements": {1: ("limits", "Quantity", "map"), 2: ("requests", "Quantity", "map")},
    "Quantity": {1: ("string", STR, "")},
    "IntOrString": {1: ("type", INT, ""), 2: ("intVal", INT, ""), 3: ("strVal", STR, "")},
    "Service": {1: ("metadata", "ObjectMeta", ""), 2: ("spec", "ServiceSpec", "")},
    "ServiceSpec": {
        1: ("ports", "ServicePort", "repeated"),
        2: ("selector", STR, "map"),
        3: ("clusterIP", STR, ""),
        4: ("type", STR, ""),
        5: ("externalIPs", STR, "repeated"),
        7: ("sessionAffinity", STR, ""),
        10: ("externalName", STR, ""),
    },
    "ServicePort": {
        1: ("name", STR, ""),
        2: ("protocol", STR, ""),
        3: ("port", INT, ""),
        4: ("targetPort", "IntOrString", ""),
        5: ("nodePort", INT, ""),
    },
    "Deployment": {1: ("metadata", "ObjectMeta", ""), 2: ("spec", "DeploymentSpec", "")},
    "DeploymentSpec": {
        1: ("replicas", INT, ""),
        2: ("selector", "LabelSelector", ""),
        3: ("template", "PodTemplateSpec", ""),
        4: ("strategy", "DeploymentStrategy", ""),
        5: ("minReadySeconds", INT, ""),
        6: ("revisionHistoryLimit", INT, ""),
        7: ("paused", BOOL, ""),
        9: ("progressDeadlineSeconds", INT, ""),
    },
    "DeploymentStrategy": {
        1: ("type", STR, ""),
        2: ("rollingUpdate", "RollingUpdateDeployment", ""),
    },
    "RollingUpdateDeployment": {
        1: ("maxUnavailable", "IntOrString", ""),
        2: ("maxSurge", "IntOrString", ""),
    },
    "Job": {1: ("metadata", "ObjectMeta", ""), 2: ("spec", "JobSpec", "")},
    "JobSpec": {
        1: ("parallelism", INT, ""),
        2: ("completions", INT, ""),
        3: ("activeDeadlineSeconds", INT, ""),
        4: ("selector", "LabelSelector", ""),
        5: ("manualSelector", BOOL, ""),
        6: ("template", "PodTemplateSpec", ""),
        7: ("backoffLimit", INT, ""),
        8: ("ttlSecondsAfterFinished", INT, ""),
        9: ("completionMode", STR, ""),
        10: ("suspend", BOOL, ""),
    },
    "SelfSubjectAccessReview": {
        1: ("metadata", "ObjectMeta", ""),
        2: ("spec", "SelfSubjectAccessReviewSpec", ""),
    },
    "SelfSubjectAccessReviewSpec": {
        1: ("resourceAttributes", "ResourceAttributes", ""),
        2: ("nonResourceAttributes", "NonResourceAttributes", ""),
    },
    "ResourceAttributes": {
        1: ("namespace", STR, ""),
        2: ("verb", STR, ""),
        3: ("group", STR, ""),
        4: ("version", STR, ""),
        5: ("resource", STR, ""),
        6: ("subresource", STR, ""),
        7: ("name", STR, ""),
    },
    "NonResourceAttributes": {1: ("path", STR, ""), 2: ("verb", STR, "")},
    "SelfSubjectRulesReview": {
        1: ("metadata", "ObjectMeta", ""),
        2: ("spec", "SelfSubjectRulesReviewSpec", ""),
    },
    "SelfSubjectRulesReviewSpec": {1: ("namespace", STR, "")},
    "SelfSubjectReview": {1: ("metadata", "ObjectMeta", "")},
}

_TOP_LEVEL = {
    ("v1", "ConfigMap"): "ConfigMap",
    ("v1", "Secret"): "Secret",
    ("v1", "Namespace"): "Namespace",
    ("v1", "ServiceAccount"): "ServiceAccount",
    ("v1", "Pod"): "Pod",
    ("v1", "Service"): "Service",
    ("apps/v1", "Deployment"): "Deployment",
    ("batch/v1", "Job"): "Job",
    ("authorization.k8s.io/v1", "SelfSubjectAccessReview"): "SelfSubjectAccessReview",
    ("authorization.k8s.io/v1", "SelfSubjectRulesReview"): "SelfSubjectRulesReview",
    ("authentication.k8s.io/v1", "SelfSubjectReview"): "SelfSubjectReview",
}


class _Malformed(Exception):
    pass


def _varint(data: bytes, offset: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if offset >= len(data) or shift > 63:
            raise _Malformed("truncated varint")
        byte = data[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, offset
        shift += 7


def _fields(data: bytes) -> list[tuple[int, int, Any]]:
    """(number, wire type, raw value) for each field of a message."""
    fields: list[tuple[int, int, Any]] = []
    offset = 0
    while offset < len(data):
        key, offset = _varint(data, offset)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, offset = _varint(data, offset)
        elif wire == 1:
            value, offset = data[offset : offset + 8], offset + 8
        elif wire == 2:
            size, offset = _varint(data, offset)
            if offset + size > len(data):
                raise _Malformed("truncated field")
            value, offset = data[offset : offset + size], offset + size
        elif wire == 5:
            value, offset = data[offset : offset + 4], offset + 4
        else:
            raise _Malformed(f"unsupported wire type {wire}")
        fields.append((number, wire, value))
    return fields


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _scalar(kind: str, wire: int, value: Any) -> Any:
    if kind == STR:
        return bytes(value).decode("utf-8")
    if kind == BYTES:
        return base64.b64encode(bytes(value)).decode()
    if kind == INT:
        return _signed(value) if wire == 0 else None
    if kind == BOOL:
        return bool(value) if wire == 0 else None
    return _message(kind, bytes(value))


def _message(name: str, data: bytes) -> Any:
    if name == "Time":
        values = {number: value for number, wire, value in _fields(data) if wire == 0}
        if not values.get(1):
            return None
        moment = datetime.fromtimestamp(_signed(values[1]), UTC)
        return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
    schema = _SCHEMAS[name]
    result: dict[str, Any] = {}
    for number, wire, value in _fields(data):
        field = schema.get(number)
        if field is None:
            continue
        json_name, kind, cardinality = field
        if cardinality == "map":
            entry = {n: (w, v) for n, w, v in _fields(bytes(value))}
            key = bytes(entry.get(1, (2, b""))[1]).decode("utf-8")
            wire_value = entry.get(2, (2, b""))
            result.setdefault(json_name, {})[key] = _scalar(kind, *wire_value)
        elif cardinality == "repeated":
            result.setdefault(json_name, []).append(_scalar(kind, wire, value))
        else:
            result[json_name] = _scalar(kind, wire, value)
    if name == "Quantity":
        return result.get("string", "0")
    if name == "IntOrString":
        return result.get("strVal", "") if result.get("type") == 1 else result.get("intVal", 0)
    return _prune(result)


def _prune(value: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in value.items() if v not in ("", 0, False, None, [], {})}


def decode_object(body: bytes) -> dict[str, Any]:
    """Decode a ``k8s\\0``-framed protobuf object into its JSON form (400 if it cannot)."""
    if not body.startswith(_MAGIC):
        raise bad_request("the protobuf body does not start with the Kubernetes magic number")
    try:
        envelope = _message("Unknown", body[len(_MAGIC) :])
        type_meta = envelope.get("typeMeta") or {}
        api_version, kind = type_meta.get("apiVersion", ""), type_meta.get("kind", "")
        name = _TOP_LEVEL.get((api_version, kind))
        if name is None:
            raise bad_request(
                f"this server cannot decode {kind or 'objects'} ({api_version}) sent as protobuf: "
                "send application/json"
            )
        raw = base64.b64decode(envelope.get("raw", ""))
        obj = _message(name, raw)
    except (_Malformed, UnicodeDecodeError, KeyError) as exc:
        raise bad_request(f"the protobuf body is malformed: {exc}") from exc
    obj["apiVersion"] = api_version
    obj["kind"] = kind
    return dict(obj)
