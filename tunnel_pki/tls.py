"""``ssl.SSLContext`` factories for the server's port and the agent's connection.

Both sides speak TLS 1.2 or newer (OpenSSL picks 1.3 when both can), offer
only forward-secret AEAD suites for TLS 1.2, refuse renegotiation, verify
certificates in OpenSSL's strict X.509 mode, and announce ALPN ``http/1.1``
alone: the tunnel is a WebSocket over HTTP/1.1, never h2.

The server's port serves enrolment and the REST API without client
certificates and the agents' WebSockets with them, so by default it asks for
a client certificate without requiring one (``CERT_OPTIONAL``); a certificate
that is sent must still verify against the CA, and the server checks per
request who it names (:func:`tunnel_pki.identity.verify_client_certificate`).

Key material on disk: the ssl module loads certificate chains and private
keys from files only. :func:`load_cert_chain` therefore writes them, mode
0600, into a private temporary directory (mode 0700, under the system's
temporary directory, ``TMPDIR``) that is removed as soon as OpenSSL has read
them. The private key in that file is encrypted with a random one-time
password that never leaves memory, so a file left behind by a crash reveals
nothing.
"""

from __future__ import annotations

import os
import secrets
import ssl
import tempfile

from cryptography.hazmat.primitives import serialization

from tunnel_pki.certs import certificate_pem, load_certificate_bundle
from tunnel_pki.errors import KeyMismatchError, TlsContextError
from tunnel_pki.files import create_private_file
from tunnel_pki.keys import load_private_key, public_key_der

__all__ = [
    "ALPN_PROTOCOLS",
    "client_context",
    "load_cert_chain",
    "load_trusted_cas",
    "server_context",
]

ALPN_PROTOCOLS = ("http/1.1",)
"""The only application protocol either side offers."""

# TLS 1.2 only; TLS 1.3 suites are all AEAD with forward secrecy and are left to OpenSSL.
_TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"


def server_context(
    cert_pem: bytes,
    key_pem: bytes,
    client_ca_pem: bytes,
    *,
    require_client_cert: bool = False,
) -> ssl.SSLContext:
    """Return a server context that presents ``cert_pem`` and verifies clients with the CA.

    ``cert_pem`` is the server certificate (optionally followed by its chain),
    ``key_pem`` its private key, ``client_ca_pem`` the CA bundle client
    certificates must chain to. Client certificates are optional unless
    ``require_client_cert``.

    Raises :class:`~tunnel_pki.errors.InvalidCertificateError`,
    :class:`~tunnel_pki.errors.InvalidKeyError`,
    :class:`~tunnel_pki.errors.KeyMismatchError` or :class:`TlsContextError`.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _configure(context)
    context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    load_cert_chain(context, cert_pem, key_pem)
    load_trusted_cas(context, client_ca_pem)
    context.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    return context


def client_context(
    ca_pem: bytes,
    *,
    cert_pem: bytes | None = None,
    key_pem: bytes | None = None,
) -> ssl.SSLContext:
    """Return a client context that trusts ``ca_pem`` only and checks the host name.

    The system's trust store is not loaded: the server must chain to the given
    CA bundle. With ``cert_pem`` and ``key_pem`` (both or neither) the client
    presents that certificate (mutual TLS).

    Raises :class:`~tunnel_pki.errors.InvalidCertificateError`,
    :class:`~tunnel_pki.errors.InvalidKeyError`,
    :class:`~tunnel_pki.errors.KeyMismatchError` or :class:`TlsContextError`.
    """
    if (cert_pem is None) != (key_pem is None):
        raise TlsContextError("give both cert_pem and key_pem for a client certificate, or neither")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    _configure(context)
    context.check_hostname = True
    context.verify_mode = ssl.CERT_REQUIRED
    load_trusted_cas(context, ca_pem)
    if cert_pem is not None and key_pem is not None:
        load_cert_chain(context, cert_pem, key_pem)
    return context


def load_trusted_cas(context: ssl.SSLContext, ca_pem: bytes) -> None:
    """Make ``context`` trust the certificates of the PEM bundle ``ca_pem``, from memory."""
    certificates = load_certificate_bundle(ca_pem)
    cadata = b"".join(certificate_pem(certificate) for certificate in certificates)
    try:
        context.load_verify_locations(cadata=cadata.decode("ascii"))
    except ssl.SSLError as exc:
        raise TlsContextError(
            "the ssl module refused the CA bundle: give PEM CA certificates"
        ) from exc


def load_cert_chain(context: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """Load a certificate chain and its private key into ``context``.

    Both are parsed and matched first, so that errors are typed and say what
    is wrong; then they go through a private temporary directory (see the
    module docstring), with the key encrypted under a one-time password.
    """
    certificates = load_certificate_bundle(cert_pem)
    key = load_private_key(key_pem)
    if public_key_der(certificates[0].public_key()) != public_key_der(key.public_key()):
        raise KeyMismatchError(
            "the private key does not belong to the certificate: "
            "give the key written with that certificate"
        )
    password = secrets.token_bytes(32)
    encrypted_key = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(password),
    )
    chain = b"".join(certificate_pem(certificate) for certificate in certificates)
    with tempfile.TemporaryDirectory(prefix="tunnel-pki-") as directory:
        cert_path = os.path.join(directory, "cert.pem")
        key_path = os.path.join(directory, "key.pem")
        create_private_file(cert_path, chain)
        create_private_file(key_path, encrypted_key)
        try:
            context.load_cert_chain(cert_path, key_path, password=password)
        except ssl.SSLError as exc:
            raise TlsContextError(
                "the ssl module refused the certificate chain or its key: "
                "check that the chain is in order, leaf first"
            ) from exc


def _configure(context: ssl.SSLContext) -> None:
    """Apply the settings both sides share: versions, suites, renegotiation, ALPN."""
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
    # Strict X.509 checks (as Python 3.13's default context does) hold our own certificates
    # to RFC 5280; they all comply, so anything that does not is not ours.
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    try:
        context.set_ciphers(_TLS12_CIPHERS)
    except ssl.SSLError as exc:
        raise TlsContextError("this OpenSSL offers no ECDHE AEAD cipher suite for TLS 1.2") from exc
    context.set_alpn_protocols(list(ALPN_PROTOCOLS))
