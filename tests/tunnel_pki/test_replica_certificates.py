"""Server replicas' certificates: each names one replica, and is never an agent's (or the
reverse)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

import pytest

from tunnel_pki.ca import CertificateAuthority, IssuedCertificate
from tunnel_pki.errors import InvalidCertificateError, InvalidNameError
from tunnel_pki.identity import verify_client_certificate, verify_replica_certificate

IssueAgent = Callable[..., tuple[IssuedCertificate, bytes]]
LIFETIME = timedelta(days=30)


def test_a_replica_certificate_names_its_replica_and_its_hosts(
    ca: CertificateAuthority, now: datetime
) -> None:
    issued = ca.issue_replica_certificate(
        "server-7f9c", ["10.0.3.7", "localhost"], LIFETIME, now=now
    )
    assert verify_replica_certificate(issued.cert_pem, ca.cert_pem, now) == "server-7f9c"
    assert issued.key_pem is not None


def test_a_replica_certificate_is_not_an_agents(ca: CertificateAuthority, now: datetime) -> None:
    issued = ca.issue_replica_certificate("server-a", ["10.0.3.7"], LIFETIME, now=now)
    with pytest.raises(InvalidCertificateError, match="not an agent certificate"):
        verify_client_certificate(issued.cert_pem, ca.cert_pem, now)


def test_an_agent_certificate_is_not_a_replicas(
    ca: CertificateAuthority, now: datetime, issue_agent: IssueAgent
) -> None:
    issued, _ = issue_agent(ca, "prod-eu")
    with pytest.raises(InvalidCertificateError, match="not a server replica"):
        verify_replica_certificate(issued.cert_pem, ca.cert_pem, now)


def test_another_cas_replica_is_refused(
    ca: CertificateAuthority, other_ca: CertificateAuthority, now: datetime
) -> None:
    issued = other_ca.issue_replica_certificate("server-a", ["10.0.3.7"], LIFETIME, now=now)
    with pytest.raises(InvalidCertificateError, match="not issued by this tunnel's CA"):
        verify_replica_certificate(issued.cert_pem, ca.cert_pem, now)


def test_an_expired_replica_certificate_is_refused(ca: CertificateAuthority, now: datetime) -> None:
    issued = ca.issue_replica_certificate("server-a", ["10.0.3.7"], LIFETIME, now=now)
    with pytest.raises(InvalidCertificateError, match="expired"):
        verify_replica_certificate(issued.cert_pem, ca.cert_pem, now + LIFETIME + timedelta(1))


@pytest.mark.parametrize("name", ["", "Server", "server_a", "a" * 64, "server-a\n"])
def test_replica_names_are_dns_labels(ca: CertificateAuthority, now: datetime, name: str) -> None:
    with pytest.raises(InvalidNameError):
        ca.issue_replica_certificate(name, ["10.0.3.7"], LIFETIME, now=now)
