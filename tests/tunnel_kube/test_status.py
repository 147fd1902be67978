"""How the tunnel's own refusals are written: a Status, or plain text for discovery."""

from __future__ import annotations

from tunnel_kube import error_answer, status_body

#: What client-go asks /api and /apis for (aggregated discovery, then the old form).
AGGREGATED = (
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,"
    "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,"
    "application/json"
)


def test_a_refusal_is_a_kubernetes_status_in_json() -> None:
    answer = error_answer(403, "Forbidden", "no grant", "application/json")
    assert answer == (status_body(403, "Forbidden", "no grant"), "application/json")


def test_a_refusal_of_aggregated_discovery_is_the_message_in_plain_text() -> None:
    body, content_type = error_answer(403, "Forbidden", "no grant", AGGREGATED)
    assert (body, content_type) == (b"no grant\n", "text/plain; charset=utf-8")


def test_a_client_preferring_plain_json_gets_a_status_even_if_it_also_takes_discovery() -> None:
    accept = "application/json, application/json;g=apidiscovery.k8s.io;v=v2"
    assert error_answer(403, "Forbidden", "no grant", accept)[1] == "application/json"
