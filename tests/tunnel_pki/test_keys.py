"""Private keys and the key policy (tunnel_pki.keys)."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from tunnel_pki.errors import InvalidKeyError, UnsupportedKeyError
from tunnel_pki.keys import (
    MAX_KEY_PEM_SIZE,
    check_public_key,
    generate_private_key,
    load_private_key,
    private_key_to_pem,
    public_key_der,
)


def _pem(key: ed25519.Ed25519PrivateKey | rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def test_generate_private_key_makes_p256_keys() -> None:
    key = generate_private_key()
    assert isinstance(key.curve, ec.SECP256R1)


def test_private_key_pem_round_trips() -> None:
    key = generate_private_key()
    pem = private_key_to_pem(key)
    assert pem.startswith(b"-----BEGIN PRIVATE KEY-----")
    loaded = load_private_key(pem)
    assert public_key_der(loaded.public_key()) == public_key_der(key.public_key())


def test_load_private_key_accepts_sec1_ec_and_rsa_2048() -> None:
    ec_key = generate_private_key()
    sec1 = ec_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    assert isinstance(load_private_key(sec1), ec.EllipticCurvePrivateKey)
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    assert isinstance(load_private_key(_pem(rsa_key)), rsa.RSAPrivateKey)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"garbage",
        b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        b"\x30\x82\x01\x00",
    ],
)
def test_load_private_key_refuses_garbage(data: bytes) -> None:
    with pytest.raises(InvalidKeyError, match="not a PEM private key"):
        load_private_key(data)


def test_load_private_key_refuses_oversized_input_before_parsing() -> None:
    pem = private_key_to_pem(generate_private_key())
    with pytest.raises(InvalidKeyError, match="more than the"):
        load_private_key(pem + b"\n" * MAX_KEY_PEM_SIZE)


def test_load_private_key_refuses_encrypted_keys() -> None:
    pem = generate_private_key().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    )
    with pytest.raises(InvalidKeyError, match="encrypted"):
        load_private_key(pem)


def test_load_private_key_refuses_a_public_key() -> None:
    pem = (
        generate_private_key()
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    with pytest.raises(InvalidKeyError):
        load_private_key(pem)


def test_load_private_key_refuses_text() -> None:
    pem = private_key_to_pem(generate_private_key()).decode()
    with pytest.raises(InvalidKeyError, match="PEM bytes"):
        load_private_key(pem)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        (ed25519.Ed25519PrivateKey.generate(), "Ed25519"),
        (ec.generate_private_key(ec.SECP521R1()), "secp521r1"),
        (ec.generate_private_key(ec.SECP256K1()), "secp256k1"),
        (rsa.generate_private_key(public_exponent=65537, key_size=1024), "1024 bits"),
        (rsa.generate_private_key(public_exponent=3, key_size=2048), "65537"),
    ],
    ids=["ed25519", "p521", "secp256k1", "rsa1024", "rsa-e3"],
)
def test_load_private_key_refuses_keys_outside_policy(key: object, reason: str) -> None:
    pem = _pem(key)  # type: ignore[arg-type]
    with pytest.raises(UnsupportedKeyError, match=reason):
        load_private_key(pem)


def test_check_public_key_accepts_p384() -> None:
    key = ec.generate_private_key(ec.SECP384R1()).public_key()
    assert check_public_key(key) is key


def test_key_errors_never_quote_key_material() -> None:
    pem = private_key_to_pem(generate_private_key())
    truncated = pem[: len(pem) // 2] + b"\n-----END PRIVATE KEY-----\n"
    with pytest.raises(InvalidKeyError) as caught:
        load_private_key(truncated)
    body = pem.decode().splitlines()[1:-1]
    assert not any(line in str(caught.value) for line in body)
