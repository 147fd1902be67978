"""Decoding the protobuf bodies of kubectl's typed clients (k8s\\0 + runtime.Unknown)."""

from __future__ import annotations

import pytest

from tests.kubestub.protobuf import decode_object
from tests.kubestub.status import ApiError


def _varint(value: int) -> bytes:
    out = b""
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out += bytes([byte | 0x80])
        else:
            return out + bytes([byte])


def _field(number: int, payload: bytes | int) -> bytes:
    if isinstance(payload, int):
        return _varint(number << 3) + _varint(payload)
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _envelope(api_version: str, kind: str, raw: bytes) -> bytes:
    type_meta = _field(1, api_version.encode()) + _field(2, kind.encode())
    return b"k8s\x00" + _field(1, type_meta) + _field(2, raw)


def test_a_configmap_decodes_with_empty_fields_dropped() -> None:
    metadata = (
        _field(1, b"settings")
        + _field(2, b"")
        + _field(8, b"")  # creationTimestamp: the zero Time
        + _field(11, _field(1, b"app") + _field(2, b"web"))
    )
    raw = _field(1, metadata) + _field(2, _field(1, b"mode") + _field(2, b"fast"))
    assert decode_object(_envelope("v1", "ConfigMap", raw)) == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "settings", "labels": {"app": "web"}},
        "data": {"mode": "fast"},
    }


def test_a_deployment_decodes_nested_messages_and_int_or_string() -> None:
    container = _field(1, b"nginx") + _field(2, b"nginx:1.27") + _field(8, b"")
    template = _field(2, _field(2, container))
    strategy = _field(2, _field(1, _field(1, 1) + _field(3, b"25%")) + _field(2, _field(2, 2)))
    spec = _field(1, 3) + _field(3, template) + _field(4, strategy)
    decoded = decode_object(_envelope("apps/v1", "Deployment", _field(1, b"") + _field(2, spec)))
    assert decoded["spec"] == {
        "replicas": 3,
        "template": {"spec": {"containers": [{"name": "nginx", "image": "nginx:1.27"}]}},
        "strategy": {"rollingUpdate": {"maxUnavailable": "25%", "maxSurge": 2}},
    }


def test_an_access_review_decodes() -> None:
    attributes = (
        _field(1, b"default") + _field(2, b"create") + _field(5, b"pods") + _field(6, b"exec")
    )
    raw = _field(2, _field(1, attributes))
    decoded = decode_object(_envelope("authorization.k8s.io/v1", "SelfSubjectAccessReview", raw))
    assert decoded["spec"]["resourceAttributes"] == {
        "namespace": "default",
        "verb": "create",
        "resource": "pods",
        "subresource": "exec",
    }


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"{}", id="no-magic"),
        pytest.param(_envelope("v1", "Endpoints", b""), id="unsupported-kind"),
        pytest.param(b"k8s\x00" + _field(1, b"\xff\xff"), id="truncated"),
    ],
)
def test_undecodable_bodies_are_bad_requests(body: bytes) -> None:
    with pytest.raises(ApiError) as caught:
        decode_object(body)
    assert caught.value.code == 400
