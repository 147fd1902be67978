"""Who an agent's client certificate says it is, and whether the tunnel CA vouches for it.

The cluster is read from the URI SAN ``urn:tunnel:cluster:<cluster>`` and
from nowhere else: a certificate without it is invalid, even if its common
name looks like a cluster. The ssl module has checked the chain during the
handshake; :func:`verify_client_certificate` checks it again, per request,
against the CA the server trusts, because the server's port takes
connections without a client certificate too (``CERT_OPTIONAL``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import ExtendedKeyUsageOID

from tunnel_pki.certs import certificate_fingerprint, load_certificate
from tunnel_pki.errors import InvalidCertificateError, InvalidNameError
from tunnel_pki.names import (
    CLUSTER_URI_PREFIX,
    REPLICA_URI_PREFIX,
    cluster_from_uri,
    replica_from_uri,
)
from tunnel_pki.validity import require_aware

__all__ = [
    "ClientIdentity",
    "identity_from_certificate",
    "verify_client_certificate",
    "verify_replica_certificate",
]


@dataclass(frozen=True, slots=True)
class ClientIdentity:
    """The agent a client certificate names: its cluster, and the certificate's particulars.

    ``fingerprint`` is the lowercase hex SHA-256 of the DER certificate; the
    times are timezone-aware (UTC).
    """

    cluster: str
    serial: int
    fingerprint: str
    not_before: datetime
    not_after: datetime


def identity_from_certificate(certificate: x509.Certificate | bytes) -> ClientIdentity:
    """Read the identity a client certificate (object, PEM or DER) names; do not verify it.

    Raises :class:`InvalidCertificateError` unless the certificate has exactly
    one ``urn:tunnel:cluster:`` URI SAN naming a valid cluster.
    """
    cert = load_certificate(certificate)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        san = None
    except ValueError as exc:
        # cryptography parses extensions lazily and says ValueError for malformed ones.
        raise InvalidCertificateError("the certificate's extensions are malformed") from exc
    uris = [] if san is None else san.get_values_for_type(x509.UniformResourceIdentifier)
    clusters: list[str] = []
    for uri in uris:
        try:
            cluster = cluster_from_uri(uri)
        except InvalidNameError as exc:
            raise InvalidCertificateError(
                f"the certificate's {CLUSTER_URI_PREFIX} SAN does not name a valid cluster"
            ) from exc
        if cluster is not None:
            clusters.append(cluster)
    if len(clusters) != 1:
        raise InvalidCertificateError(
            f"the certificate has {len(clusters)} {CLUSTER_URI_PREFIX}<cluster> URI SANs, "
            "not one: it is not an agent certificate from this tunnel's CA"
        )
    return ClientIdentity(
        cluster=clusters[0],
        serial=cert.serial_number,
        fingerprint=certificate_fingerprint(cert),
        not_before=cert.not_valid_before_utc,
        not_after=cert.not_valid_after_utc,
    )


def verify_client_certificate(
    certificate: x509.Certificate | bytes,
    ca_certificate: x509.Certificate | bytes,
    now: datetime,
) -> ClientIdentity:
    """Verify an agent's client certificate against the CA and return its identity.

    The certificate must be issued by ``ca_certificate`` (issuer name and
    signature), be within its validity at ``now`` (as must the CA), not be a
    CA, allow clientAuth, and name a cluster (see
    :func:`identity_from_certificate`). Raises :class:`InvalidCertificateError`
    otherwise, with a message that says which check failed.
    """
    cert = load_certificate(certificate)
    _verify_issued(cert, load_certificate(ca_certificate), require_aware(now))
    return identity_from_certificate(cert)


def verify_replica_certificate(
    certificate: x509.Certificate | bytes,
    ca_certificate: x509.Certificate | bytes,
    now: datetime,
) -> str:
    """Verify a server replica's certificate against the CA; the replica it names.

    The same checks as :func:`verify_client_certificate` (issuer, validity,
    clientAuth), and exactly one ``urn:tunnel:replica:`` URI SAN: an agent's
    certificate is never a replica's.
    """
    cert = load_certificate(certificate)
    _verify_issued(cert, load_certificate(ca_certificate), require_aware(now))
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = san.get_values_for_type(x509.UniformResourceIdentifier)
        replicas = [name for uri in uris if (name := replica_from_uri(uri)) is not None]
    except (x509.ExtensionNotFound, InvalidNameError, ValueError) as exc:
        raise InvalidCertificateError("the certificate does not name a server replica") from exc
    if len(replicas) != 1:
        raise InvalidCertificateError(
            f"the certificate has {len(replicas)} {REPLICA_URI_PREFIX}<name> URI SANs, not "
            "one: it is not a server replica's certificate from this tunnel's CA"
        )
    return replicas[0]


def _verify_issued(cert: x509.Certificate, ca: x509.Certificate, moment: datetime) -> None:
    """Raise :class:`InvalidCertificateError` unless ``ca`` issued ``cert``, both are valid
    at ``moment``, and ``cert`` is an end entity for clientAuth."""
    try:
        cert.verify_directly_issued_by(ca)
    except ValueError as exc:
        # The issuer name differs, or the signature algorithm does not fit the CA's key.
        raise InvalidCertificateError(
            "the certificate was not issued by this tunnel's CA: enrol the agent again"
        ) from exc
    except (InvalidSignature, TypeError) as exc:
        raise InvalidCertificateError(
            "the certificate's signature does not verify with this tunnel's CA key: "
            "enrol the agent again"
        ) from exc
    for checked, what in ((ca, "the CA certificate"), (cert, "the certificate")):
        if moment < checked.not_valid_before_utc:
            raise InvalidCertificateError(
                f"{what} is not valid before {checked.not_valid_before_utc.isoformat()}: "
                "check the clocks"
            )
        if moment > checked.not_valid_after_utc:
            raise InvalidCertificateError(
                f"{what} expired on {checked.not_valid_after_utc.isoformat()}: "
                "renew it (an agent enrols again)"
            )
    try:
        _check_client_usage(cert)
    except ValueError as exc:
        raise InvalidCertificateError("the certificate's extensions are malformed") from exc


def _check_client_usage(cert: x509.Certificate) -> None:
    """Raise :class:`InvalidCertificateError` unless ``cert`` is an end entity for clientAuth."""
    extensions = cert.extensions
    try:
        constraints = extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        pass
    else:
        if constraints.ca:
            raise InvalidCertificateError("the certificate is a CA certificate, not an agent's")
    try:
        usage = extensions.get_extension_for_class(x509.KeyUsage).value
    except x509.ExtensionNotFound:
        pass
    else:
        if not usage.digital_signature:
            raise InvalidCertificateError("the certificate's key usage lacks digitalSignature")
    try:
        extended = extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        extended = None
    if extended is None or ExtendedKeyUsageOID.CLIENT_AUTH not in extended:
        raise InvalidCertificateError(
            "the certificate does not allow TLS client authentication (no clientAuth "
            "extended key usage): it is not an agent certificate"
        )
