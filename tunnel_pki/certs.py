"""Loading certificates from outside, with bounded sizes, and naming them.

Certificates arrive as PEM (files, enrolment answers) or DER (the ssl
module's ``getpeercert(binary_form=True)``); both are read here so that every
caller gets the same size bound and the same typed error.
"""

from __future__ import annotations

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

from tunnel_pki.errors import InvalidCertificateError

__all__ = [
    "MAX_BUNDLE_PEM_SIZE",
    "MAX_CERTIFICATE_SIZE",
    "certificate_fingerprint",
    "certificate_pem",
    "load_certificate",
    "load_certificate_bundle",
]

MAX_CERTIFICATE_SIZE = 16 * 1024
"""The largest single certificate (PEM or DER) we read; ours are under 1 KiB."""

MAX_BUNDLE_PEM_SIZE = 256 * 1024
"""The largest PEM bundle of CA certificates we read."""

_PEM_MARKER = b"-----BEGIN"


def load_certificate(data: x509.Certificate | bytes) -> x509.Certificate:
    """Return the certificate in ``data``: PEM (its first certificate) or DER bytes.

    A :class:`~cryptography.x509.Certificate` is returned as it is. Raises
    :class:`InvalidCertificateError` for input that is not bytes, is larger
    than :data:`MAX_CERTIFICATE_SIZE` or does not parse.
    """
    if isinstance(data, x509.Certificate):
        return data
    if not isinstance(data, bytes):
        raise InvalidCertificateError("a certificate must be given as PEM or DER bytes")
    if len(data) > MAX_CERTIFICATE_SIZE:
        raise InvalidCertificateError(
            f"certificate is {len(data)} bytes, more than the {MAX_CERTIFICATE_SIZE} allowed: "
            "give a single certificate"
        )
    try:
        if data.lstrip().startswith(_PEM_MARKER):
            return x509.load_pem_x509_certificate(data)
        return x509.load_der_x509_certificate(data)
    except ValueError as exc:
        raise InvalidCertificateError(
            "data is not a PEM or DER certificate (expected '-----BEGIN CERTIFICATE-----')"
        ) from exc


def load_certificate_bundle(pem: bytes) -> list[x509.Certificate]:
    """Return the certificates of a PEM bundle (at least one).

    Raises :class:`InvalidCertificateError` for input that is not bytes, is
    larger than :data:`MAX_BUNDLE_PEM_SIZE`, holds no certificate or does not parse.
    """
    if not isinstance(pem, bytes):
        raise InvalidCertificateError("a certificate bundle must be given as PEM bytes")
    if len(pem) > MAX_BUNDLE_PEM_SIZE:
        raise InvalidCertificateError(
            f"certificate bundle is {len(pem)} bytes, more than the {MAX_BUNDLE_PEM_SIZE} "
            "allowed: give only the tunnel CA certificates"
        )
    try:
        certificates = x509.load_pem_x509_certificates(pem)
    except ValueError as exc:
        raise InvalidCertificateError(
            "data is not a PEM certificate bundle (expected '-----BEGIN CERTIFICATE-----')"
        ) from exc
    return certificates


def certificate_fingerprint(certificate: x509.Certificate) -> str:
    """Return the lowercase hex SHA-256 of the certificate's DER encoding."""
    return certificate.fingerprint(hashes.SHA256()).hex()


def certificate_pem(certificate: x509.Certificate) -> bytes:
    """Return the certificate as PEM."""
    return certificate.public_bytes(serialization.Encoding.PEM)
