"""Fixtures for the tunnel_pki tests: CAs, agent certificates, hand-made certificates."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tunnel_pki import (
    CertificateAuthority,
    IssuedCertificate,
    generate_private_key,
    load_private_key,
    make_csr,
    private_key_to_pem,
)

AgentFactory = Callable[..., tuple[IssuedCertificate, bytes]]
Forger = Callable[..., x509.Certificate]


@pytest.fixture
def now() -> datetime:
    """The current time: the TLS tests need certificates valid by the real clock."""
    return datetime.now(UTC)


@pytest.fixture
def ca() -> CertificateAuthority:
    return CertificateAuthority.create()


@pytest.fixture
def other_ca() -> CertificateAuthority:
    return CertificateAuthority.create()


@pytest.fixture
def issue_agent(now: datetime) -> AgentFactory:
    """Return ``issue(ca, cluster, lifetime=..., at=...)`` -> (issued certificate, key PEM)."""

    def issue(
        authority: CertificateAuthority,
        cluster: str = "prod",
        *,
        lifetime: timedelta = timedelta(days=1),
        at: datetime | None = None,
    ) -> tuple[IssuedCertificate, bytes]:
        key = generate_private_key()
        issued = authority.sign_client_csr(
            make_csr(key, cluster), cluster, lifetime, now if at is None else at
        )
        return issued, private_key_to_pem(key)

    return issue


@pytest.fixture
def forge(now: datetime) -> Forger:
    """Return ``forge(ca, usages=..., uris=...)``: a certificate the CA's key signs by hand.

    It lets a test build what the CA itself would never issue (no clientAuth,
    no cluster URI, two cluster URIs) while keeping the signature genuine.
    """

    def make(
        authority: CertificateAuthority,
        *,
        usages: Sequence[x509.ObjectIdentifier] | None = (ExtendedKeyUsageOID.CLIENT_AUTH,),
        uris: Sequence[str] = ("urn:tunnel:cluster:prod",),
        common_name: str = "prod",
    ) -> x509.Certificate:
        ca_key = load_private_key(authority.key_pem)
        key = generate_private_key()
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(authority.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(days=1))
        )
        if usages is not None:
            builder = builder.add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
        if uris:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.UniformResourceIdentifier(u) for u in uris]),
                critical=False,
            )
        return builder.sign(ca_key, hashes.SHA256())

    return make
