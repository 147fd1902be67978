"""Certificates and keys shared by the agent and the server (not wire format).

It depends on ``cryptography`` and the standard library (``ssl``) alone, and
imports nothing from the project but :mod:`protocol.errors` (the root of the
error hierarchy). The agent and the server both import it; it imports neither.

Modules, one concept each:

- :mod:`~tunnel_pki.errors`: the ``PkiError`` subtree of ``TunnelError``
- :mod:`~tunnel_pki.names`: cluster names, server host names, the cluster URI SAN
- :mod:`~tunnel_pki.keys`: private keys and the key policy
- :mod:`~tunnel_pki.csr`: the agent's certificate signing request
- :mod:`~tunnel_pki.certs`: loading certificates with bounded sizes
- :mod:`~tunnel_pki.validity`: aware times, clock skew, lifetime fraction
- :mod:`~tunnel_pki.ca`: the certificate authority and the certificates it issues
- :mod:`~tunnel_pki.identity`: who a client certificate names, verified against the CA
- :mod:`~tunnel_pki.tls`: ``ssl.SSLContext`` factories for the server and the agent
- :mod:`~tunnel_pki.files`: atomic mode-0600 files for secrets
"""

from tunnel_pki.ca import CertificateAuthority, IssuedCertificate
from tunnel_pki.certs import certificate_fingerprint, load_certificate, load_certificate_bundle
from tunnel_pki.csr import make_csr, parse_csr
from tunnel_pki.errors import (
    InvalidCertificateError,
    InvalidCsrError,
    InvalidKeyError,
    InvalidNameError,
    InvalidValidityError,
    KeyMismatchError,
    PkiError,
    TlsContextError,
    UnsupportedKeyError,
)
from tunnel_pki.files import write_private_file
from tunnel_pki.identity import ClientIdentity, identity_from_certificate, verify_client_certificate
from tunnel_pki.keys import generate_private_key, load_private_key, private_key_to_pem
from tunnel_pki.names import validate_cluster_name, validate_dns_name
from tunnel_pki.tls import client_context, server_context
from tunnel_pki.validity import certificate_lifetime_fraction

__all__ = [
    "CertificateAuthority",
    "ClientIdentity",
    "InvalidCertificateError",
    "InvalidCsrError",
    "InvalidKeyError",
    "InvalidNameError",
    "InvalidValidityError",
    "IssuedCertificate",
    "KeyMismatchError",
    "PkiError",
    "TlsContextError",
    "UnsupportedKeyError",
    "certificate_fingerprint",
    "certificate_lifetime_fraction",
    "client_context",
    "generate_private_key",
    "identity_from_certificate",
    "load_certificate",
    "load_certificate_bundle",
    "load_private_key",
    "make_csr",
    "parse_csr",
    "private_key_to_pem",
    "server_context",
    "validate_cluster_name",
    "validate_dns_name",
    "verify_client_certificate",
    "write_private_file",
]
