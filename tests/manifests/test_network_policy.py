"""The agent's NetworkPolicy: no ingress; egress to DNS, the API server, the tunnel server."""

from __future__ import annotations

import pytest

from .support import VARIANTS, AgentValues, Object, find, render

VALUES = AgentValues()

DNS = {
    "to": [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
        }
    ],
    "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
}
API_SERVER = {"ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}]}


def _policy(variant: str, values: AgentValues = VALUES) -> Object:
    objects = render(variant, values.for_variant(variant))
    return find(objects, "NetworkPolicy", "tunnel-agent", values.namespace)


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_policy_selects_the_agent_pod(variant: str) -> None:
    objects = render(variant, VALUES.for_variant(variant))
    policy = find(objects, "NetworkPolicy", "tunnel-agent")
    template = find(objects, "Deployment", "tunnel-agent")["spec"]["template"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= template["metadata"]["labels"].items()


@pytest.mark.parametrize("variant", VARIANTS)
def test_all_ingress_is_denied_but_runs_to_the_commands_gateway(variant: str) -> None:
    spec = _policy(variant)["spec"]
    assert "Ingress" in spec["policyTypes"]
    assert spec.get("ingress", []) == [
        {
            "from": [
                {
                    "podSelector": {
                        "matchExpressions": [{"key": "tunnel.k8s.io/run", "operator": "Exists"}]
                    }
                }
            ],
            "ports": [{"protocol": "TCP", "port": 8444}],
        }
    ]


@pytest.mark.parametrize("variant", VARIANTS)
def test_egress_is_dns_the_api_server_and_the_tunnel_server_only(variant: str) -> None:
    spec = _policy(variant)["spec"]
    assert "Egress" in spec["policyTypes"]
    tunnel_server = {"ports": [{"protocol": "TCP", "port": 9443}]}
    assert spec["egress"] == [DNS, API_SERVER, tunnel_server]


def test_the_tunnel_server_rule_follows_the_server_url() -> None:
    values = AgentValues(server_url="https://tunnel.corp.test", namespaces=())
    assert _policy("full", values)["spec"]["egress"][2] == {
        "ports": [{"protocol": "TCP", "port": 443}]
    }
