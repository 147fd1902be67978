"""Cluster and host name validation (tunnel_pki.names)."""

from __future__ import annotations

import pytest

from protocol.errors import TunnelError
from tunnel_pki.errors import InvalidNameError, PkiError
from tunnel_pki.names import (
    cluster_from_uri,
    cluster_uri,
    validate_cluster_name,
    validate_dns_name,
)


@pytest.mark.parametrize(
    "name", ["a", "0", "prod", "prod-eu-1", "1st", "a-b-c", "a" * 63, "x" + "-" * 61 + "y"]
)
def test_validate_cluster_name_accepts_dns_labels(name: str) -> None:
    assert validate_cluster_name(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "Prod",
        "-x",
        "x-",
        "-",
        "a" * 64,
        "a.b",
        "..",
        "a_b",
        "a b",
        " prod",
        "prod\n",
        "préprod",
        "\u212a",  # KELVIN SIGN, which lower() turns into ASCII 'k'
        "prod/../etc",
    ],
)
def test_validate_cluster_name_refuses_non_labels(name: str) -> None:
    with pytest.raises(InvalidNameError, match="invalid cluster name"):
        validate_cluster_name(name)


def test_validate_cluster_name_refuses_non_strings() -> None:
    with pytest.raises(InvalidNameError):
        validate_cluster_name(b"prod")  # type: ignore[arg-type]


def test_invalid_name_error_is_a_value_error_in_the_tunnel_hierarchy() -> None:
    assert issubclass(InvalidNameError, ValueError)
    assert issubclass(InvalidNameError, PkiError)
    assert issubclass(PkiError, TunnelError)


def test_cluster_name_error_message_quotes_long_input_shortened() -> None:
    with pytest.raises(InvalidNameError) as caught:
        validate_cluster_name("X" * 10_000)
    assert len(str(caught.value)) < 300


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("localhost", "localhost"),
        ("Tunnel.Example.COM", "tunnel.example.com"),
        ("*.example.com", "*.example.com"),
        ("xn--bcher-kva.example", "xn--bcher-kva.example"),
        ("a" * 63 + ".com", "a" * 63 + ".com"),
    ],
)
def test_validate_dns_name_accepts_and_lowercases_host_names(name: str, expected: str) -> None:
    assert validate_dns_name(name) == expected


@pytest.mark.parametrize(
    "name",
    [
        "",
        ".",
        "example.com.",
        "a..b",
        "-a.com",
        "a-.com",
        "a" * 64 + ".com",
        ".".join(["a" * 63] * 4),  # 255 characters
        "foo.*.com",
        "*",
        "under_score.com",
        "bücher.example",
        "\u212aelvin.example",
        "10.0.0.256",
        "1.2.3",
    ],
)
def test_validate_dns_name_refuses_bad_host_names(name: str) -> None:
    with pytest.raises(InvalidNameError, match="invalid host name"):
        validate_dns_name(name)


def test_cluster_uri_round_trips_through_cluster_from_uri() -> None:
    assert cluster_uri("prod-1") == "urn:tunnel:cluster:prod-1"
    assert cluster_from_uri(cluster_uri("prod-1")) == "prod-1"


def test_cluster_from_uri_ignores_other_uris_and_refuses_bad_names() -> None:
    assert cluster_from_uri("spiffe://example.org/agent") is None
    with pytest.raises(InvalidNameError):
        cluster_from_uri("urn:tunnel:cluster:Prod")
