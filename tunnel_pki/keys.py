"""Private keys: generate, serialise, load, and the key policy.

Keys we generate are ECDSA P-256: small, fast, and accepted by every TLS
stack that matters. Keys we accept from elsewhere (a CSR, a loaded CA) are
EC P-256 or P-384, or RSA of 2048 to 8192 bits with the public exponent
65537; anything else is refused by :func:`check_public_key`.
"""

from __future__ import annotations

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes

from tunnel_pki.errors import InvalidKeyError, UnsupportedKeyError

__all__ = [
    "MAX_KEY_PEM_SIZE",
    "PrivateKey",
    "PublicKey",
    "check_public_key",
    "generate_private_key",
    "load_private_key",
    "private_key_to_pem",
    "public_key_der",
    "signature_hash",
]

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
"""The private keys the package works with."""

PublicKey = ec.EllipticCurvePublicKey | rsa.RSAPublicKey
"""The public keys the package accepts."""

MAX_KEY_PEM_SIZE = 16 * 1024
"""The largest private key PEM we read; an RSA 8192-bit key is about 6.5 KiB."""

_CURVES: tuple[type[ec.EllipticCurve], ...] = (ec.SECP256R1, ec.SECP384R1)
_MIN_RSA_BITS = 2048
# Above this, verifying a signature costs more than an unauthenticated peer should get to spend.
_MAX_RSA_BITS = 8192
_RSA_EXPONENT = 65537


def generate_private_key() -> ec.EllipticCurvePrivateKey:
    """Return a new ECDSA P-256 private key."""
    return ec.generate_private_key(ec.SECP256R1())


def private_key_to_pem(key: PrivateKey) -> bytes:
    """Return ``key`` as an unencrypted PKCS#8 PEM; store it with ``write_private_file``."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def load_private_key(pem: bytes) -> PrivateKey:
    """Load an unencrypted PEM private key that is within the key policy.

    Raises :class:`InvalidKeyError` for input that is not bytes, is larger than
    :data:`MAX_KEY_PEM_SIZE`, is encrypted or is not a private key PEM, and
    :class:`UnsupportedKeyError` for a key outside the policy.
    """
    if not isinstance(pem, bytes):
        raise InvalidKeyError("a private key must be given as PEM bytes")
    if len(pem) > MAX_KEY_PEM_SIZE:
        raise InvalidKeyError(
            f"private key PEM is {len(pem)} bytes, more than the {MAX_KEY_PEM_SIZE} allowed: "
            "give a single EC or RSA key"
        )
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except TypeError as exc:
        # cryptography says TypeError when the key is encrypted and no password was given.
        raise InvalidKeyError(
            "private key PEM is encrypted: give it unencrypted (keep the file mode 0600)"
        ) from exc
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise InvalidKeyError(
            "data is not a PEM private key (expected '-----BEGIN PRIVATE KEY-----' or "
            "'-----BEGIN EC PRIVATE KEY-----')"
        ) from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise UnsupportedKeyError(
            f"{_describe(key.public_key())} keys are not supported: use EC P-256 or P-384, "
            "or RSA of at least 2048 bits"
        )
    check_public_key(key.public_key())
    return key


def check_public_key(key: PublicKeyTypes) -> PublicKey:
    """Return ``key`` if it is within the key policy, else raise :class:`UnsupportedKeyError`."""
    if isinstance(key, ec.EllipticCurvePublicKey):
        if isinstance(key.curve, _CURVES):
            return key
        raise UnsupportedKeyError(
            f"EC curve {key.curve.name} is not supported: use P-256 (secp256r1) or P-384"
        )
    if isinstance(key, rsa.RSAPublicKey):
        if not _MIN_RSA_BITS <= key.key_size <= _MAX_RSA_BITS:
            raise UnsupportedKeyError(
                f"RSA key of {key.key_size} bits is not supported: "
                f"use {_MIN_RSA_BITS} to {_MAX_RSA_BITS} bits, or EC P-256"
            )
        if key.public_numbers().e != _RSA_EXPONENT:
            raise UnsupportedKeyError("RSA keys must use the public exponent 65537")
        return key
    raise UnsupportedKeyError(
        f"{_describe(key)} keys are not supported: use EC P-256 or P-384, "
        "or RSA of at least 2048 bits"
    )


def signature_hash(key: PrivateKey) -> hashes.SHA256 | hashes.SHA384:
    """Return the hash to sign with ``key``: SHA-384 for P-384, SHA-256 otherwise."""
    if isinstance(key, ec.EllipticCurvePrivateKey) and isinstance(key.curve, ec.SECP384R1):
        return hashes.SHA384()
    return hashes.SHA256()


def public_key_der(key: PublicKeyTypes) -> bytes:
    """Return the DER SubjectPublicKeyInfo of ``key``, to compare keys for equality."""
    return key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _describe(key: PublicKeyTypes) -> str:
    """Name a key's type for an error message, e.g. 'Ed448' for Ed448PublicKey."""
    name = type(key).__name__
    for suffix in ("PublicKey", "PrivateKey"):
        name = name.removesuffix(suffix)
    return name.lstrip("_") or "this type of"
