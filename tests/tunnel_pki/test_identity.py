"""Reading and verifying agents' client certificates (tunnel_pki.identity, tunnel_pki.certs)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import ExtendedKeyUsageOID

from tunnel_pki.ca import CertificateAuthority, IssuedCertificate
from tunnel_pki.certs import (
    MAX_BUNDLE_PEM_SIZE,
    MAX_CERTIFICATE_SIZE,
    load_certificate,
    load_certificate_bundle,
)
from tunnel_pki.errors import InvalidCertificateError
from tunnel_pki.identity import (
    ClientIdentity,
    identity_from_certificate,
    verify_client_certificate,
)

IssueAgent = Callable[..., tuple[IssuedCertificate, bytes]]
Forger = Callable[..., x509.Certificate]


# --- loading ----------------------------------------------------------------------------------


def test_load_certificate_reads_pem_der_and_objects(ca: CertificateAuthority) -> None:
    cert = ca.certificate
    der = cert.public_bytes(Encoding.DER)
    assert load_certificate(ca.cert_pem) == cert
    assert load_certificate(b"\n  " + ca.cert_pem) == cert
    assert load_certificate(der) == cert
    assert load_certificate(cert) is cert


@pytest.mark.parametrize("data", [b"", b"garbage", b"-----BEGIN CERTIFICATE-----\nAA==\n"])
def test_load_certificate_refuses_garbage(data: bytes) -> None:
    with pytest.raises(InvalidCertificateError, match="not a PEM or DER certificate"):
        load_certificate(data)


def test_load_certificate_refuses_oversized_input(ca: CertificateAuthority) -> None:
    with pytest.raises(InvalidCertificateError, match="more than the"):
        load_certificate(ca.cert_pem + b"\n" * MAX_CERTIFICATE_SIZE)


def test_load_certificate_refuses_text(ca: CertificateAuthority) -> None:
    with pytest.raises(InvalidCertificateError, match="bytes"):
        load_certificate(ca.cert_pem.decode())  # type: ignore[arg-type]


def test_load_certificate_bundle_reads_every_certificate(
    ca: CertificateAuthority, other_ca: CertificateAuthority
) -> None:
    bundle = load_certificate_bundle(ca.cert_pem + other_ca.cert_pem)
    assert bundle == [ca.certificate, other_ca.certificate]


@pytest.mark.parametrize("data", [b"", b"no certificate here"])
def test_load_certificate_bundle_refuses_a_bundle_without_certificates(data: bytes) -> None:
    with pytest.raises(InvalidCertificateError):
        load_certificate_bundle(data)


def test_load_certificate_bundle_refuses_oversized_input(ca: CertificateAuthority) -> None:
    with pytest.raises(InvalidCertificateError, match="more than the"):
        load_certificate_bundle(ca.cert_pem + b"\n" * MAX_BUNDLE_PEM_SIZE)


# --- reading the identity ---------------------------------------------------------------------


def test_identity_from_certificate_reads_the_cluster_from_pem_der_or_object(
    ca: CertificateAuthority, issue_agent: IssueAgent
) -> None:
    issued, _ = issue_agent(ca, "prod-eu-1")
    cert = x509.load_pem_x509_certificate(issued.cert_pem)
    expected = ClientIdentity(
        cluster="prod-eu-1",
        serial=issued.serial,
        fingerprint=issued.fingerprint,
        not_before=issued.not_before,
        not_after=issued.not_after,
    )
    assert identity_from_certificate(issued.cert_pem) == expected
    assert identity_from_certificate(cert.public_bytes(Encoding.DER)) == expected
    assert identity_from_certificate(cert) == expected


def test_identity_from_certificate_does_not_fall_back_to_the_common_name(
    ca: CertificateAuthority, forge: Forger
) -> None:
    cert = forge(ca, uris=(), common_name="prod")
    with pytest.raises(InvalidCertificateError, match="0 urn:tunnel:cluster:"):
        identity_from_certificate(cert)


def test_identity_from_certificate_ignores_other_uris(
    ca: CertificateAuthority, forge: Forger
) -> None:
    cert = forge(ca, uris=("spiffe://example.org/x", "urn:tunnel:cluster:prod"))
    assert identity_from_certificate(cert).cluster == "prod"
    with pytest.raises(InvalidCertificateError):
        identity_from_certificate(forge(ca, uris=("spiffe://example.org/x",)))


def test_identity_from_certificate_refuses_two_clusters(
    ca: CertificateAuthority, forge: Forger
) -> None:
    cert = forge(ca, uris=("urn:tunnel:cluster:prod", "urn:tunnel:cluster:staging"))
    with pytest.raises(InvalidCertificateError, match="2 urn:tunnel:cluster:"):
        identity_from_certificate(cert)


def test_identity_from_certificate_refuses_an_invalid_cluster_name(
    ca: CertificateAuthority, forge: Forger
) -> None:
    cert = forge(ca, uris=("urn:tunnel:cluster:Prod/../x",))
    with pytest.raises(InvalidCertificateError, match="valid cluster"):
        identity_from_certificate(cert)


# --- verifying against the CA -----------------------------------------------------------------


def test_verify_client_certificate_returns_the_identity(
    ca: CertificateAuthority, issue_agent: IssueAgent, now: datetime
) -> None:
    issued, _ = issue_agent(ca, "prod")
    identity = verify_client_certificate(issued.cert_pem, ca.cert_pem, now)
    assert identity.cluster == "prod"
    assert identity.fingerprint == issued.fingerprint
    assert identity == verify_client_certificate(issued.cert_pem, ca.certificate, now)


def test_verify_client_certificate_refuses_a_certificate_from_another_ca(
    ca: CertificateAuthority,
    other_ca: CertificateAuthority,
    issue_agent: IssueAgent,
    now: datetime,
) -> None:
    issued, _ = issue_agent(other_ca, "prod")
    with pytest.raises(InvalidCertificateError, match="not issued by this tunnel's CA"):
        verify_client_certificate(issued.cert_pem, ca.cert_pem, now)


def test_verify_client_certificate_refuses_a_ca_with_the_same_name_but_another_key(
    issue_agent: IssueAgent, now: datetime
) -> None:
    genuine = CertificateAuthority.create("tunnel CA same")
    impostor = CertificateAuthority.create("tunnel CA same")
    issued, _ = issue_agent(impostor, "prod")
    with pytest.raises(InvalidCertificateError, match="signature does not verify"):
        verify_client_certificate(issued.cert_pem, genuine.cert_pem, now)


def test_verify_client_certificate_refuses_an_expired_certificate(
    ca: CertificateAuthority, issue_agent: IssueAgent, now: datetime
) -> None:
    issued, _ = issue_agent(ca, "prod", lifetime=timedelta(hours=1), at=now - timedelta(hours=2))
    with pytest.raises(InvalidCertificateError, match="the certificate expired"):
        verify_client_certificate(issued.cert_pem, ca.cert_pem, now)


def test_verify_client_certificate_refuses_a_not_yet_valid_certificate(
    ca: CertificateAuthority, issue_agent: IssueAgent, now: datetime
) -> None:
    issued, _ = issue_agent(ca, "prod", at=now + timedelta(hours=1))
    with pytest.raises(InvalidCertificateError, match="the certificate is not valid before"):
        verify_client_certificate(issued.cert_pem, ca.cert_pem, now)


def test_verify_client_certificate_accepts_within_the_clock_skew(
    ca: CertificateAuthority, issue_agent: IssueAgent, now: datetime
) -> None:
    issued, _ = issue_agent(ca, "prod", at=now + timedelta(minutes=4))
    assert verify_client_certificate(issued.cert_pem, ca.cert_pem, now).cluster == "prod"


def test_verify_client_certificate_refuses_a_server_certificate(
    ca: CertificateAuthority, now: datetime
) -> None:
    server = ca.issue_server_certificate(["localhost"], timedelta(days=1), now=now)
    with pytest.raises(InvalidCertificateError, match="clientAuth"):
        verify_client_certificate(server.cert_pem, ca.cert_pem, now)


@pytest.mark.parametrize(
    "usages",
    [(ExtendedKeyUsageOID.SERVER_AUTH,), None],
    ids=["server-auth-only", "no-extended-key-usage"],
)
def test_verify_client_certificate_refuses_a_certificate_without_client_auth(
    ca: CertificateAuthority,
    forge: Forger,
    now: datetime,
    usages: tuple[x509.ObjectIdentifier, ...] | None,
) -> None:
    cert = forge(ca, usages=usages)
    with pytest.raises(InvalidCertificateError, match="clientAuth"):
        verify_client_certificate(cert, ca.certificate, now)


def test_verify_client_certificate_refuses_an_expired_ca(
    issue_agent: IssueAgent, now: datetime
) -> None:
    ca = CertificateAuthority.create(now=now - timedelta(days=2), lifetime=timedelta(days=1))
    issued, _ = issue_agent(ca, "prod", at=now - timedelta(days=2))
    with pytest.raises(InvalidCertificateError, match="expired"):
        verify_client_certificate(issued.cert_pem, ca.cert_pem, now)


def test_verify_client_certificate_refuses_a_ca_certificate_itself(
    ca: CertificateAuthority, now: datetime
) -> None:
    with pytest.raises(InvalidCertificateError, match="CA certificate"):
        verify_client_certificate(ca.cert_pem, ca.cert_pem, now)
