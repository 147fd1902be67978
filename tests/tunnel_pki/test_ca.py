"""The certificate authority: creation, loading, server and agent certificates (tunnel_pki.ca)."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tunnel_pki.ca import CA_LIFETIME, CertificateAuthority, IssuedCertificate
from tunnel_pki.csr import make_csr
from tunnel_pki.errors import (
    InvalidCertificateError,
    InvalidKeyError,
    InvalidNameError,
    InvalidValidityError,
    KeyMismatchError,
)
from tunnel_pki.identity import verify_client_certificate
from tunnel_pki.keys import (
    generate_private_key,
    load_private_key,
    private_key_to_pem,
    public_key_der,
)

E = TypeVar("E", bound=x509.ExtensionType)
IssueAgent = Callable[..., tuple[IssuedCertificate, bytes]]

NOW = datetime(2030, 6, 1, 12, 0, 0, tzinfo=UTC)
DAY = timedelta(days=1)


def _ext(cert: x509.Certificate, kind: type[E]) -> x509.Extension[E]:
    return cert.extensions.get_extension_for_class(kind)


def _cert(issued: IssuedCertificate) -> x509.Certificate:
    return x509.load_pem_x509_certificate(issued.cert_pem)


# --- creating and loading ---------------------------------------------------------------------


def test_create_makes_a_self_signed_ten_year_ca_limited_to_end_entities() -> None:
    ca = CertificateAuthority.create(now=NOW)
    cert = ca.certificate
    assert cert.subject == cert.issuer
    cert.verify_directly_issued_by(cert)
    constraints = _ext(cert, x509.BasicConstraints)
    assert constraints.critical
    assert constraints.value.ca is True
    assert constraints.value.path_length == 0
    usage = _ext(cert, x509.KeyUsage)
    assert usage.critical
    assert usage.value.key_cert_sign
    assert usage.value.crl_sign
    assert not usage.value.digital_signature
    ski = _ext(cert, x509.SubjectKeyIdentifier).value
    assert ski == x509.SubjectKeyIdentifier.from_public_key(cert.public_key())
    assert cert.not_valid_before_utc <= NOW
    assert cert.not_valid_after_utc == NOW + CA_LIFETIME


def test_create_names_each_ca_uniquely_by_default() -> None:
    first = CertificateAuthority.create().certificate.subject.rfc4514_string()
    second = CertificateAuthority.create().certificate.subject.rfc4514_string()
    assert first.startswith("CN=tunnel CA ")
    assert second.startswith("CN=tunnel CA ")
    assert first != second


def test_create_uses_the_given_name() -> None:
    ca = CertificateAuthority.create("acme tunnel CA")
    assert ca.certificate.subject.rfc4514_string() == "CN=acme tunnel CA"


@pytest.mark.parametrize("name", ["", "x" * 65])
def test_create_refuses_names_a_certificate_cannot_carry(name: str) -> None:
    with pytest.raises(InvalidNameError):
        CertificateAuthority.create(name)


def test_create_refuses_a_naive_now() -> None:
    with pytest.raises(InvalidValidityError, match="timezone-aware"):
        CertificateAuthority.create(now=datetime(2030, 1, 1))


def test_load_round_trips_cert_and_key(ca: CertificateAuthority, now: datetime) -> None:
    loaded = CertificateAuthority.load(ca.cert_pem, ca.key_pem)
    assert loaded.cert_pem == ca.cert_pem
    assert loaded.fingerprint == ca.fingerprint
    assert public_key_der(load_private_key(loaded.key_pem).public_key()) == public_key_der(
        load_private_key(ca.key_pem).public_key()
    )
    # What the loaded CA signs, the original CA's certificate verifies.
    issued = loaded.sign_client_csr(make_csr(generate_private_key(), "prod"), "prod", DAY, now)
    assert verify_client_certificate(issued.cert_pem, ca.cert_pem, now).cluster == "prod"
    assert _ext(_cert(issued), x509.AuthorityKeyIdentifier).value.key_identifier == (
        _ext(ca.certificate, x509.SubjectKeyIdentifier).value.digest
    )


def test_load_refuses_a_key_from_another_ca(
    ca: CertificateAuthority, other_ca: CertificateAuthority
) -> None:
    with pytest.raises(KeyMismatchError, match="does not belong"):
        CertificateAuthority.load(ca.cert_pem, other_ca.key_pem)


def test_load_refuses_a_server_certificate_as_ca(ca: CertificateAuthority) -> None:
    server = ca.issue_server_certificate(["localhost"], DAY)
    assert server.key_pem is not None
    with pytest.raises(InvalidCertificateError, match="not a CA"):
        CertificateAuthority.load(server.cert_pem, server.key_pem)


def test_load_refuses_garbage(ca: CertificateAuthority) -> None:
    with pytest.raises(InvalidCertificateError):
        CertificateAuthority.load(b"garbage", ca.key_pem)
    with pytest.raises(InvalidKeyError):
        CertificateAuthority.load(ca.cert_pem, b"garbage")


def test_load_refuses_a_ca_certificate_that_is_not_self_signed(
    ca: CertificateAuthority, other_ca: CertificateAuthority
) -> None:
    # A CA certificate for ca's key, signed by other_ca: right key, wrong issuer.
    other_key = load_private_key(other_ca.key_pem)
    key = load_private_key(ca.key_pem)
    cross = (
        x509.CertificateBuilder()
        .subject_name(ca.certificate.subject)
        .issuer_name(other_ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - DAY)
        .not_valid_after(NOW + DAY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(other_key, hashes.SHA256())
    )
    with pytest.raises(InvalidCertificateError, match="not self-signed"):
        CertificateAuthority.load(cross.public_bytes(Encoding.PEM), ca.key_pem)


# --- server certificates ----------------------------------------------------------------------


def test_issue_server_certificate_carries_dns_and_ip_sans_for_server_auth() -> None:
    ca = CertificateAuthority.create(now=NOW)
    issued = ca.issue_server_certificate(
        ["Tunnel.Example.com", "localhost", "127.0.0.1", "::1"], timedelta(days=90), now=NOW
    )
    cert = _cert(issued)
    san = _ext(cert, x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["tunnel.example.com", "localhost"]
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    ]
    assert list(_ext(cert, x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert _ext(cert, x509.BasicConstraints).value.ca is False
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == (
        "tunnel.example.com"
    )
    cert.verify_directly_issued_by(ca.certificate)
    assert issued.not_after == NOW + timedelta(days=90)


def test_issue_server_certificate_returns_the_key_it_generated(ca: CertificateAuthority) -> None:
    issued = ca.issue_server_certificate(["localhost"], DAY)
    assert issued.key_pem is not None
    key = load_private_key(issued.key_pem)
    assert public_key_der(key.public_key()) == public_key_der(_cert(issued).public_key())


@pytest.mark.parametrize(
    "hosts", [[], ["bad host"], ["localhost", "a..b"], ["300.1.1.1.1"], "localhost"]
)
def test_issue_server_certificate_refuses_bad_hosts(
    ca: CertificateAuthority, hosts: list[str]
) -> None:
    with pytest.raises(InvalidNameError):
        ca.issue_server_certificate(hosts, DAY)


def test_issued_certificates_end_no_later_than_the_ca() -> None:
    ca = CertificateAuthority.create(now=NOW, lifetime=timedelta(days=30))
    issued = ca.issue_server_certificate(["localhost"], timedelta(days=365), now=NOW)
    assert issued.not_after == ca.certificate.not_valid_after_utc


def test_an_expired_ca_refuses_to_issue() -> None:
    ca = CertificateAuthority.create(now=NOW, lifetime=DAY)
    with pytest.raises(InvalidCertificateError, match="expired"):
        ca.issue_server_certificate(["localhost"], DAY, now=NOW + 2 * DAY)


# --- agent certificates from CSRs -------------------------------------------------------------


def test_sign_client_csr_writes_the_cluster_identity(ca: CertificateAuthority) -> None:
    key = generate_private_key()
    issued = ca.sign_client_csr(make_csr(key, "prod-eu-1"), "prod-eu-1", DAY, NOW)
    cert = _cert(issued)
    assert cert.subject.rfc4514_string() == "O=tunnel-agent,CN=prod-eu-1"
    assert cert.issuer == ca.certificate.subject
    san = _ext(cert, x509.SubjectAlternativeName).value
    assert list(san) == [x509.UniformResourceIdentifier("urn:tunnel:cluster:prod-eu-1")]
    assert list(_ext(cert, x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    usage = _ext(cert, x509.KeyUsage).value
    assert usage.digital_signature
    assert not usage.key_cert_sign
    assert _ext(cert, x509.BasicConstraints).value.ca is False
    assert _ext(cert, x509.AuthorityKeyIdentifier).value.key_identifier == (
        _ext(ca.certificate, x509.SubjectKeyIdentifier).value.digest
    )
    assert public_key_der(cert.public_key()) == public_key_der(key.public_key())


def test_sign_client_csr_ignores_the_csr_subject_and_extensions(ca: CertificateAuthority) -> None:
    key = generate_private_key()
    hostile = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.COMMON_NAME, "other-cluster"),
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
                ]
            )
        )
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.UniformResourceIdentifier("urn:tunnel:cluster:other-cluster"),
                    x509.DNSName("evil.example"),
                ]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    issued = ca.sign_client_csr(hostile.public_bytes(Encoding.PEM), "prod", DAY, NOW)
    cert = _cert(issued)
    assert cert.subject.rfc4514_string() == "O=tunnel-agent,CN=prod"
    san = _ext(cert, x509.SubjectAlternativeName).value
    assert list(san) == [x509.UniformResourceIdentifier("urn:tunnel:cluster:prod")]
    assert _ext(cert, x509.BasicConstraints).value.ca is False


def test_sign_client_csr_validity_allows_clock_skew(ca: CertificateAuthority) -> None:
    issued = ca.sign_client_csr(
        make_csr(generate_private_key(), "prod"), "prod", timedelta(hours=12), NOW
    )
    assert issued.not_before == NOW - timedelta(minutes=5)
    assert issued.not_after == NOW + timedelta(hours=12)
    assert issued.not_before.tzinfo is not None
    assert issued.not_after.tzinfo is not None


def test_sign_client_csr_describes_the_certificate(ca: CertificateAuthority) -> None:
    issued = ca.sign_client_csr(make_csr(generate_private_key(), "prod"), "prod", DAY, NOW)
    cert = _cert(issued)
    assert issued.key_pem is None
    assert issued.serial == cert.serial_number
    assert 0 < issued.serial < 2**128
    assert issued.fingerprint == cert.fingerprint(hashes.SHA256()).hex()
    assert len(issued.fingerprint) == 64


def test_sign_client_csr_draws_random_serials(ca: CertificateAuthority) -> None:
    csr = make_csr(generate_private_key(), "prod")
    serials = {ca.sign_client_csr(csr, "prod", DAY, NOW).serial for _ in range(8)}
    assert len(serials) == 8


@pytest.mark.parametrize("cluster", ["Prod", "-x", "a" * 64, "a.b", ".."])
def test_sign_client_csr_refuses_invalid_cluster_names(
    ca: CertificateAuthority, cluster: str
) -> None:
    with pytest.raises(InvalidNameError):
        ca.sign_client_csr(make_csr(generate_private_key(), "prod"), cluster, DAY, NOW)


@pytest.mark.parametrize("lifetime", [timedelta(0), timedelta(seconds=-1)])
def test_sign_client_csr_refuses_non_positive_lifetimes(
    ca: CertificateAuthority, lifetime: timedelta
) -> None:
    with pytest.raises(InvalidValidityError, match="positive"):
        ca.sign_client_csr(make_csr(generate_private_key(), "prod"), "prod", lifetime, NOW)


def test_sign_client_csr_refuses_a_naive_now(ca: CertificateAuthority) -> None:
    with pytest.raises(InvalidValidityError):
        ca.sign_client_csr(
            make_csr(generate_private_key(), "prod"),
            "prod",
            DAY,
            datetime(2030, 1, 1),
        )


def test_key_pem_loads_back_as_the_ca_key(ca: CertificateAuthority) -> None:
    assert private_key_to_pem(load_private_key(ca.key_pem)) == ca.key_pem


def test_issue_agent_fixture_issues_verifiable_certificates(
    ca: CertificateAuthority, issue_agent: IssueAgent, now: datetime
) -> None:
    issued, _ = issue_agent(ca, "staging")
    assert verify_client_certificate(issued.cert_pem, ca.certificate, now).cluster == "staging"
