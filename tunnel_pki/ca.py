"""The tunnel's certificate authority: it issues the server's and the agents' certificates.

The CA is a self-signed certificate that may sign end-entity certificates
only (``path_length=0``). Agents prove who they are with a client
certificate it signed from their CSR; the identity written into that
certificate comes from the cluster name the server enrolled them under,
never from the CSR (see :mod:`tunnel_pki.csr`).
"""

from __future__ import annotations

import ipaddress
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tunnel_pki.certs import (
    certificate_fingerprint,
    certificate_pem,
    load_certificate,
)
from tunnel_pki.csr import parse_csr
from tunnel_pki.errors import (
    InvalidCertificateError,
    InvalidNameError,
    KeyMismatchError,
    UnsupportedKeyError,
)
from tunnel_pki.keys import (
    PrivateKey,
    PublicKey,
    check_public_key,
    generate_private_key,
    load_private_key,
    private_key_to_pem,
    public_key_der,
    signature_hash,
)
from tunnel_pki.names import (
    AGENT_ORGANIZATION,
    REPLICA_ORGANIZATION,
    cluster_uri,
    replica_uri,
    validate_cluster_name,
    validate_dns_name,
)
from tunnel_pki.validity import CLOCK_SKEW, require_aware, require_positive

__all__ = [
    "CA_LIFETIME",
    "SERVER_ORGANIZATION",
    "CertificateAuthority",
    "IssuedCertificate",
]

CA_LIFETIME = timedelta(days=3650)
"""How long a new CA certificate is valid: ten years."""

SERVER_ORGANIZATION = "tunnel-server"
"""The subject organization (O) of every server certificate."""

# A subject attribute is at most 64 characters (RFC 5280, appendix A, ub-common-name).
_MAX_NAME_LENGTH = 64


@dataclass(frozen=True, slots=True)
class IssuedCertificate:
    """A certificate the CA issued, with what callers need to store and track it.

    ``key_pem`` is the private key generated with the certificate, or None when
    the certificate was signed from a CSR (the requester keeps its key).
    ``fingerprint`` is the lowercase hex SHA-256 of the DER certificate; the
    times are timezone-aware (UTC) and exactly those in the certificate.
    """

    cert_pem: bytes
    key_pem: bytes | None
    serial: int
    fingerprint: str
    not_before: datetime
    not_after: datetime

    @classmethod
    def from_certificate(
        cls, certificate: x509.Certificate, key_pem: bytes | None = None
    ) -> IssuedCertificate:
        """Describe ``certificate`` (and the key issued with it, if any)."""
        return cls(
            cert_pem=certificate_pem(certificate),
            key_pem=key_pem,
            serial=certificate.serial_number,
            fingerprint=certificate_fingerprint(certificate),
            not_before=certificate.not_valid_before_utc,
            not_after=certificate.not_valid_after_utc,
        )


class CertificateAuthority:
    """A CA key and its self-signed certificate.

    Build one with :meth:`create` or :meth:`load`; store :attr:`cert_pem` for
    everyone and :attr:`key_pem` for the server only (mode 0600, see
    :func:`tunnel_pki.files.write_private_file`).
    """

    def __init__(self, certificate: x509.Certificate, key: PrivateKey) -> None:
        """Wrap a CA certificate and its key; prefer :meth:`create` and :meth:`load`."""
        self._certificate = certificate
        self._key = key
        try:
            ski = certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
        except x509.ExtensionNotFound:
            self._authority_key_id = x509.AuthorityKeyIdentifier.from_issuer_public_key(
                key.public_key()
            )
        else:
            self._authority_key_id = x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(
                ski.value
            )

    @classmethod
    def create(
        cls,
        name: str | None = None,
        *,
        now: datetime | None = None,
        lifetime: timedelta = CA_LIFETIME,
    ) -> CertificateAuthority:
        """Create a CA with a new P-256 key.

        ``name`` is the CA's common name; by default ``tunnel CA <random hex>``,
        so that two deployments' CAs never share a subject. ``now`` defaults to
        the current time.
        """
        if name is None:
            name = f"tunnel CA {secrets.token_hex(4)}"
        if not isinstance(name, str) or not 1 <= len(name) <= _MAX_NAME_LENGTH:
            raise InvalidNameError(f"CA name must be 1 to {_MAX_NAME_LENGTH} characters")
        start = _now(now)
        require_positive(lifetime)
        key = generate_private_key()
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        certificate = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(_random_serial())
            .not_valid_before(start - CLOCK_SKEW)
            .not_valid_after(start + lifetime)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .sign(key, signature_hash(key))
        )
        return cls(certificate, key)

    @classmethod
    def load(cls, cert_pem: bytes, key_pem: bytes) -> CertificateAuthority:
        """Load a CA from its PEM certificate and PEM private key.

        Raises :class:`InvalidCertificateError` if the certificate does not
        load, is not a self-signed CA certificate or holds a key outside
        policy, :class:`~tunnel_pki.errors.InvalidKeyError` if the key does not
        load, and :class:`KeyMismatchError` if they do not belong together.
        """
        certificate = load_certificate(cert_pem)
        key = load_private_key(key_pem)
        try:
            check_public_key(certificate.public_key())
        except (ValueError, UnsupportedAlgorithm) as exc:
            raise InvalidCertificateError("the CA certificate's key cannot be read") from exc
        except UnsupportedKeyError as exc:
            raise InvalidCertificateError(f"the CA certificate's key is refused: {exc}") from exc
        if public_key_der(certificate.public_key()) != public_key_der(key.public_key()):
            raise KeyMismatchError(
                "the CA private key does not belong to the CA certificate: "
                "give the key file written with that certificate"
            )
        try:
            constraints = certificate.extensions.get_extension_for_class(x509.BasicConstraints)
        except x509.ExtensionNotFound:
            constraints = None
        except ValueError as exc:
            # cryptography parses extensions lazily and says ValueError for malformed ones.
            raise InvalidCertificateError("the CA certificate's extensions are malformed") from exc
        if constraints is None or not constraints.value.ca:
            raise InvalidCertificateError(
                "the CA certificate is not a CA (no basicConstraints CA:TRUE): "
                "give the CA certificate, not a server or agent certificate"
            )
        try:
            certificate.verify_directly_issued_by(certificate)
        except (ValueError, TypeError) as exc:
            raise InvalidCertificateError(
                "the CA certificate is not self-signed: give the root CA certificate"
            ) from exc
        except InvalidSignature as exc:
            raise InvalidCertificateError(
                "the CA certificate's self-signature does not verify"
            ) from exc
        return cls(certificate, key)

    @property
    def certificate(self) -> x509.Certificate:
        """The CA certificate."""
        return self._certificate

    @property
    def cert_pem(self) -> bytes:
        """The CA certificate as PEM: what the agents and clients trust."""
        return certificate_pem(self._certificate)

    @property
    def key_pem(self) -> bytes:
        """The CA private key as unencrypted PEM: keep it with the server, mode 0600."""
        return private_key_to_pem(self._key)

    @property
    def fingerprint(self) -> str:
        """The lowercase hex SHA-256 of the CA certificate's DER encoding."""
        return certificate_fingerprint(self._certificate)

    def issue_server_certificate(
        self,
        hosts: Sequence[str],
        lifetime: timedelta,
        *,
        now: datetime | None = None,
    ) -> IssuedCertificate:
        """Issue a server certificate, with a new P-256 key, for ``hosts``.

        Each host is an IP address (v4 or v6) or a DNS name (see
        :func:`tunnel_pki.names.validate_dns_name`); each becomes a SAN. The
        certificate is for serverAuth only. ``now`` defaults to the current
        time; the certificate ends no later than the CA's.
        """
        if isinstance(hosts, str) or not hosts:
            raise InvalidNameError(
                "a server certificate needs at least one host: give a list of names or addresses"
            )
        require_positive(lifetime)
        names = [_general_name(host) for host in hosts]
        first = _host_text(names[0])
        if len(first) > _MAX_NAME_LENGTH:
            first = "tunnel server"
        subject = x509.Name(
            [
                x509.NameAttribute(NameOID.COMMON_NAME, first),
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, SERVER_ORGANIZATION),
            ]
        )
        key = generate_private_key()
        certificate = self._sign(
            subject=subject,
            public_key=key.public_key(),
            san=x509.SubjectAlternativeName(names),
            usages=(ExtendedKeyUsageOID.SERVER_AUTH,),
            lifetime=lifetime,
            now=_now(now),
        )
        return IssuedCertificate.from_certificate(certificate, private_key_to_pem(key))

    def sign_client_csr(
        self,
        csr_pem: bytes,
        cluster: str,
        lifetime: timedelta,
        now: datetime,
    ) -> IssuedCertificate:
        """Sign an agent's CSR into a client certificate for ``cluster``.

        The CSR is checked by :func:`tunnel_pki.csr.parse_csr` (raising
        :class:`~tunnel_pki.errors.InvalidCsrError`); only its public key is
        used. The certificate's subject is ``CN=<cluster>, O=tunnel-agent``,
        its one SAN the URI ``urn:tunnel:cluster:<cluster>``, its use
        clientAuth; it is valid from five minutes before ``now`` (clock skew)
        to ``now + lifetime``, no later than the CA's end.
        """
        cluster = validate_cluster_name(cluster)
        moment = require_aware(now)
        require_positive(lifetime)
        _, public_key = parse_csr(csr_pem)
        subject = x509.Name(
            [
                x509.NameAttribute(NameOID.COMMON_NAME, cluster),
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, AGENT_ORGANIZATION),
            ]
        )
        certificate = self._sign(
            subject=subject,
            public_key=public_key,
            san=x509.SubjectAlternativeName([x509.UniformResourceIdentifier(cluster_uri(cluster))]),
            usages=(ExtendedKeyUsageOID.CLIENT_AUTH,),
            lifetime=lifetime,
            now=moment,
        )
        return IssuedCertificate.from_certificate(certificate)

    def issue_replica_certificate(
        self,
        replica: str,
        hosts: Sequence[str],
        lifetime: timedelta,
        *,
        now: datetime | None = None,
    ) -> IssuedCertificate:
        """Issue a server replica's certificate for the link between replicas.

        One certificate serves both ends of the link: serverAuth for the
        replica's internal port, clientAuth when it dials another replica.
        It names the replica in the URI SAN ``urn:tunnel:replica:<replica>``
        (and carries no cluster URI, so it is never an agent's), and the
        ``hosts`` other replicas reach it at as further SANs.
        """
        replica = validate_cluster_name(replica)
        require_positive(lifetime)
        key = generate_private_key()
        subject = x509.Name(
            [
                x509.NameAttribute(NameOID.COMMON_NAME, replica),
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, REPLICA_ORGANIZATION),
            ]
        )
        names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(replica_uri(replica))]
        names += [_general_name(host) for host in hosts]
        certificate = self._sign(
            subject=subject,
            public_key=key.public_key(),
            san=x509.SubjectAlternativeName(names),
            usages=(ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH),
            lifetime=lifetime,
            now=_now(now),
        )
        return IssuedCertificate.from_certificate(certificate, private_key_to_pem(key))

    def _sign(
        self,
        *,
        subject: x509.Name,
        public_key: PublicKey,
        san: x509.SubjectAlternativeName,
        usages: tuple[x509.ObjectIdentifier, ...],
        lifetime: timedelta,
        now: datetime,
    ) -> x509.Certificate:
        """Sign an end-entity certificate valid from ``now - CLOCK_SKEW`` to ``now + lifetime``."""
        ca_end = self._certificate.not_valid_after_utc
        if now >= ca_end:
            raise InvalidCertificateError(
                f"the CA certificate expired on {ca_end.isoformat()}: create a new CA"
            )
        # Past the CA's end the chain would not verify anyway; say so in the certificate.
        not_after = min(now + lifetime, ca_end)
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._certificate.subject)
            .public_key(public_key)
            .serial_number(_random_serial())
            .not_valid_before(now - CLOCK_SKEW)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
            .add_extension(san, critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
            .add_extension(self._authority_key_id, critical=False)
        )
        return builder.sign(self._key, signature_hash(self._key))


def _general_name(host: str) -> x509.GeneralName:
    """Turn a host string into an IP address SAN if it is one, else a DNS name SAN."""
    if not isinstance(host, str):
        raise InvalidNameError("hosts must be strings: names or IP addresses")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return x509.DNSName(validate_dns_name(host))
    return x509.IPAddress(address)


def _host_text(name: x509.GeneralName) -> str:
    """Return the text of a DNS name or IP address SAN, for the subject's common name."""
    return str(name.value)


def _random_serial() -> int:
    """Return a random positive 128-bit serial number (RFC 5280, section 4.1.2.2)."""
    return secrets.randbits(128) or 1


def _now(now: datetime | None) -> datetime:
    """Return ``now`` in UTC, or the current time if it is None."""
    return datetime.now(UTC) if now is None else require_aware(now)
