"""Certificate signing requests: made by the agent, checked by the CA (tunnel_pki.csr)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa
from cryptography.x509.oid import NameOID

from tunnel_pki.ca import CertificateAuthority
from tunnel_pki.csr import MAX_CSR_PEM_SIZE, make_csr, parse_csr
from tunnel_pki.errors import InvalidCsrError, InvalidNameError
from tunnel_pki.keys import generate_private_key, public_key_der


def _csr_with(key: object, algorithm: hashes.HashAlgorithm | None) -> bytes:
    """A CSR signed by any kind of key cryptography can sign with."""
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "prod")]))
        .sign(key, algorithm)  # type: ignore[arg-type]
    )
    return csr.public_bytes(serialization.Encoding.PEM)


def _tamper(csr_pem: bytes) -> bytes:
    """Change one byte of the signed part of a CSR, keeping it well formed."""
    der = x509.load_pem_x509_csr(csr_pem).public_bytes(serialization.Encoding.DER)
    assert der.count(b"tunnel-agent") == 1
    forged = x509.load_der_x509_csr(der.replace(b"tunnel-agent", b"tunnel-agenT"))
    return forged.public_bytes(serialization.Encoding.PEM)


def test_make_csr_names_the_cluster_and_is_signed_by_the_key() -> None:
    key = generate_private_key()
    csr, public_key = parse_csr(make_csr(key, "prod"))
    assert csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "prod"
    san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == ["urn:tunnel:cluster:prod"]
    assert csr.is_signature_valid
    assert public_key_der(public_key) == public_key_der(key.public_key())


def test_make_csr_refuses_an_invalid_cluster_name() -> None:
    with pytest.raises(InvalidNameError):
        make_csr(generate_private_key(), "Prod")


@pytest.mark.parametrize(
    "key",
    [
        ec.generate_private_key(ec.SECP384R1()),
        rsa.generate_private_key(public_exponent=65537, key_size=2048),
    ],
    ids=["p384", "rsa2048"],
)
def test_parse_csr_accepts_p384_and_rsa_2048(key: ec.EllipticCurvePrivateKey) -> None:
    csr, _ = parse_csr(_csr_with(key, hashes.SHA256()))
    assert csr.is_signature_valid


def test_parse_csr_refuses_a_bad_signature() -> None:
    forged = _tamper(make_csr(generate_private_key(), "prod"))
    with pytest.raises(InvalidCsrError, match="signature does not verify"):
        parse_csr(forged)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"garbage",
        b"-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
    ],
)
def test_parse_csr_refuses_garbage(data: bytes) -> None:
    with pytest.raises(InvalidCsrError, match="not a PEM CSR"):
        parse_csr(data)


def test_parse_csr_refuses_a_certificate_in_place_of_a_csr() -> None:
    ca = CertificateAuthority.create()
    with pytest.raises(InvalidCsrError):
        parse_csr(ca.cert_pem)


def test_parse_csr_refuses_an_oversized_pem_even_if_it_would_parse() -> None:
    padded = make_csr(generate_private_key(), "prod") + b"\n" * MAX_CSR_PEM_SIZE
    x509.load_pem_x509_csr(padded)  # cryptography itself would take it
    with pytest.raises(InvalidCsrError, match="more than the 16384 allowed"):
        parse_csr(padded)


def test_parse_csr_refuses_text() -> None:
    with pytest.raises(InvalidCsrError, match="PEM bytes"):
        parse_csr(make_csr(generate_private_key(), "prod").decode())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("key", "algorithm"),
    [
        (dsa.generate_private_key(key_size=1024), hashes.SHA256()),
        (ed448.Ed448PrivateKey.generate(), None),
        (ed25519.Ed25519PrivateKey.generate(), None),
        (ec.generate_private_key(ec.SECP521R1()), hashes.SHA512()),
        (ec.generate_private_key(ec.SECP256K1()), hashes.SHA256()),
        (rsa.generate_private_key(public_exponent=65537, key_size=1024), hashes.SHA256()),
    ],
    ids=["dsa", "ed448", "ed25519", "p521", "secp256k1", "rsa1024"],
)
def test_parse_csr_refuses_keys_outside_policy(
    key: object, algorithm: hashes.HashAlgorithm | None
) -> None:
    with pytest.raises(InvalidCsrError, match="key is refused"):
        parse_csr(_csr_with(key, algorithm))


def test_sign_client_csr_refuses_a_bad_csr_with_invalid_csr_error(
    ca: CertificateAuthority, now: datetime
) -> None:
    forged = _tamper(make_csr(generate_private_key(), "prod"))
    with pytest.raises(InvalidCsrError):
        ca.sign_client_csr(forged, "prod", timedelta(days=1), now)
    dsa_csr = _csr_with(dsa.generate_private_key(key_size=1024), hashes.SHA256())
    with pytest.raises(InvalidCsrError):
        ca.sign_client_csr(dsa_csr, "prod", timedelta(days=1), now)
