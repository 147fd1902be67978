"""The certificate subtree of the project's error hierarchy.

::

    TunnelError                        (protocol.errors)
    └── PkiError
        ├── InvalidNameError           a cluster name or host name out of policy (also ValueError)
        ├── InvalidValidityError       a lifetime that is not positive, a naive datetime
        │                              (also ValueError)
        ├── InvalidKeyError            a private key that does not load
        │   └── UnsupportedKeyError    a key of a type or size outside policy
        ├── InvalidCsrError            a certificate signing request that is refused
        ├── InvalidCertificateError    a certificate that does not load, is not trusted,
        │                              is outside its validity or lacks what it must carry
        ├── KeyMismatchError           a certificate and a private key that do not belong together
        └── TlsContextError            the ssl module refused the material or the settings

Messages say what is wrong and what to do about it. They never quote key
material, and quote outside input only shortened (see :func:`shorten`).
"""

from __future__ import annotations

from protocol.errors import TunnelError

__all__ = [
    "InvalidCertificateError",
    "InvalidCsrError",
    "InvalidKeyError",
    "InvalidNameError",
    "InvalidValidityError",
    "KeyMismatchError",
    "PkiError",
    "TlsContextError",
    "UnsupportedKeyError",
    "shorten",
]


class PkiError(TunnelError):
    """Root of the errors raised by :mod:`tunnel_pki`."""


class InvalidNameError(PkiError, ValueError):
    """A cluster name or host name that is outside policy."""


class InvalidValidityError(PkiError, ValueError):
    """A lifetime that is not positive, or a datetime without a timezone."""


class InvalidKeyError(PkiError):
    """A private key that does not load: garbage, encrypted, too large, or not a private key."""


class UnsupportedKeyError(InvalidKeyError):
    """A key whose type or size is outside policy (EC P-256/P-384, RSA 2048-8192 bits)."""


class InvalidCsrError(PkiError):
    """A certificate signing request that is refused."""


class InvalidCertificateError(PkiError):
    """A certificate that does not load, is not trusted, or does not carry what it must."""


class KeyMismatchError(PkiError):
    """A certificate and a private key whose public halves differ."""


class TlsContextError(PkiError):
    """The ssl module refused the certificates, the key or the settings of a context."""


def shorten(value: object, limit: int = 64) -> str:
    """Return ``repr(value)`` cut to about ``limit`` characters, for quoting outside input."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return text[: limit - 3] + "..."
