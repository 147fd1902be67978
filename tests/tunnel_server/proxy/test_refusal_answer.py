"""How a refusal is answered: a Status, and a Warning where kubectl would hide its message."""

from __future__ import annotations

import pytest

from tunnel_kube import warning_header
from tunnel_server.proxy.refusal import ProxyRefusal, offline_refusal

CLUSTER = "/k8s/clusters/prod-eu"


@pytest.mark.parametrize(
    "path",
    ["", "/", "/api", "/api/v1", "/apis", "/apis/apps/v1?timeout=32s", "/version", "/openapi/v3"],
)
def test_a_refusal_kubectl_would_not_print_carries_its_message_in_a_warning(path: str) -> None:
    refusal = offline_refusal("prod-eu", None)

    _, headers = refusal.answer("application/json", CLUSTER + path)

    assert ("warning", warning_header(refusal.message)) in headers


@pytest.mark.parametrize(
    "path",
    ["/api/v1/pods", "/api/v1/namespaces/default/pods/demo/log", "/apis/apps/v1/deployments"],
)
def test_a_refusal_on_a_resource_carries_no_warning(path: str) -> None:
    _, headers = offline_refusal("prod-eu", None).answer("application/json", CLUSTER + path)

    assert "warning" not in dict(headers)


def test_a_forbidden_refusal_carries_no_warning_kubectl_prints_its_message() -> None:
    refusal = ProxyRefusal(403, "Forbidden", "user alice has no grant on cluster prod-eu")

    _, headers = refusal.answer("application/json", CLUSTER + "/api")

    assert "warning" not in dict(headers)


def test_a_refusal_answers_with_its_length_type_and_retry() -> None:
    body, headers = ProxyRefusal(503, "ServiceUnavailable", "busy").answer(
        "application/json", CLUSTER + "/api/v1/pods"
    )

    assert dict(headers) == {
        "content-type": "application/json",
        "content-length": str(len(body)),
        "retry-after": "1",
    }
