"""Certificate signing requests: the agent makes one, the CA checks one.

A CSR only proves that its sender holds the private key of the public key in
it. Everything else it says (subject, requested extensions, attributes) is
ignored by the CA, which writes the agent's identity from the cluster name it
was enrolled under (see :meth:`tunnel_pki.ca.CertificateAuthority.sign_client_csr`).
"""

from __future__ import annotations

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

from tunnel_pki.errors import InvalidCsrError, UnsupportedKeyError
from tunnel_pki.keys import PrivateKey, PublicKey, check_public_key, signature_hash
from tunnel_pki.names import AGENT_ORGANIZATION, cluster_uri, validate_cluster_name

__all__ = ["MAX_CSR_PEM_SIZE", "make_csr", "parse_csr"]

MAX_CSR_PEM_SIZE = 16 * 1024
"""The largest CSR PEM the CA reads; an RSA 8192-bit CSR is about 2.5 KiB."""


def make_csr(key: PrivateKey, cluster: str) -> bytes:
    """Return a PEM CSR for ``key`` that names ``cluster`` (the CA decides the final subject)."""
    cluster = validate_cluster_name(cluster)
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, cluster),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, AGENT_ORGANIZATION),
        ]
    )
    san = x509.SubjectAlternativeName([x509.UniformResourceIdentifier(cluster_uri(cluster))])
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(subject)
        .add_extension(san, critical=False)
        .sign(key, signature_hash(key))
    )
    return csr.public_bytes(serialization.Encoding.PEM)


def parse_csr(csr_pem: bytes) -> tuple[x509.CertificateSigningRequest, PublicKey]:
    """Load and check a PEM CSR; return it with its public key.

    The CSR must be bytes of at most :data:`MAX_CSR_PEM_SIZE`, parse, carry a
    valid self-signature, and hold a key within the key policy (EC P-256/P-384
    or RSA 2048-8192). Raises :class:`InvalidCsrError` otherwise.
    """
    if not isinstance(csr_pem, bytes):
        raise InvalidCsrError("a CSR must be given as PEM bytes")
    if len(csr_pem) > MAX_CSR_PEM_SIZE:
        raise InvalidCsrError(
            f"CSR is {len(csr_pem)} bytes, more than the {MAX_CSR_PEM_SIZE} allowed: "
            "send a single PEM CSR"
        )
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
    except ValueError as exc:
        raise InvalidCsrError(
            "data is not a PEM CSR (expected '-----BEGIN CERTIFICATE REQUEST-----')"
        ) from exc
    try:
        key = check_public_key(csr.public_key())
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise InvalidCsrError("the CSR's public key cannot be read: use EC P-256") from exc
    except UnsupportedKeyError as exc:
        raise InvalidCsrError(f"the CSR's key is refused: {exc}") from exc
    try:
        valid = csr.is_signature_valid
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise InvalidCsrError(
            "the CSR's signature algorithm is not supported: sign with ECDSA-SHA256"
        ) from exc
    if not valid:
        raise InvalidCsrError(
            "the CSR's signature does not verify: sign it with the private key it names"
        )
    return csr, key
