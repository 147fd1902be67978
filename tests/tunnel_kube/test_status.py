"""How the tunnel's own refusals are written: a Status, or plain text for discovery."""

from __future__ import annotations

from tunnel_kube import error_answer, status_body, warning_header
from tunnel_kube.status import MAX_WARNING

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


def test_a_warning_header_quotes_its_text_as_client_go_reads_it() -> None:
    assert warning_header('say "hi" \\ bye') == '299 - "say \\"hi\\" \\\\ bye"'


def test_a_warning_header_holds_no_control_character_and_is_bounded() -> None:
    value = warning_header("line one\r\nline two\x00\u00e9" + "x" * 2000)
    assert value.startswith('299 - "line one??line two??')
    assert all(" " <= c <= "~" for c in value)
    assert len(value) <= MAX_WARNING + len('299 - ""')
