"""The server's state directory: CA, serving certificate, admin token, database.

Layout (created on first start, mode 0700; keys and tokens 0600)::

    STATE_DIR/ca.crt  ca.key          the CA that signs agents' certificates
    STATE_DIR/server.crt server.key   the serving certificate (unless --tls-cert)
    STATE_DIR/admin-token             the first admin's API token
    STATE_DIR/state.db                the SQLite store

A file of those that others may read is made the owner's alone at start, with a
warning: a volume mounted with an fsGroup is made group-readable by the kubelet.
"""

from __future__ import annotations

import fcntl
import logging
import os
import secrets
import stat
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from cryptography import x509

from tunnel_pki.ca import CertificateAuthority
from tunnel_pki.certs import certificate_pem, load_certificate, load_certificate_bundle
from tunnel_pki.errors import PkiError
from tunnel_pki.files import write_private_file
from tunnel_server.config import ServerSettings
from tunnel_server.errors import ConfigError
from tunnel_server.store.base import AlreadyExistsError, Store, hash_token

__all__ = [
    "LOCK_FILE",
    "PRIVATE_FILES",
    "ServerIdentity",
    "StateLock",
    "ensure_admin",
    "new_token",
    "prepare_state_dir",
]

logger = logging.getLogger(__name__)

#: Serving certificates are re-issued when this close to expiry.
_RENEW_BEFORE = timedelta(days=30)
ADMIN_USER = "admin"


@dataclass(frozen=True, slots=True)
class ServerIdentity:
    """What the server presents and what its clients pin."""

    ca: CertificateAuthority
    tls_cert_pem: bytes
    tls_key_pem: bytes
    #: The bundle agents, tunnelctl and kubeconfigs pin to reach this server.
    ca_bundle_pem: bytes


#: The file whose lock says a server is using the directory (:class:`StateLock`).
LOCK_FILE = "lock"
#: The files of the state directory that hold secrets (keys, tokens, token hashes).
PRIVATE_FILES = ("ca.key", "server.key", "admin-token", "state.db", "state.db-wal", "state.db-shm")


def _keep_private(state: Path) -> None:
    """Make each of :data:`PRIVATE_FILES` that others may read the owner's alone."""
    for name in PRIVATE_FILES:
        path = state / name
        try:
            mode = stat.S_IMODE(path.stat().st_mode)
        except FileNotFoundError:
            continue
        if mode & 0o077:
            private = mode & 0o700
            path.chmod(private)
            logger.warning("%s was open to others (mode %o); made %o", path, mode, private)


def new_token(prefix: str) -> str:
    """A fresh high-entropy token such as ``tat_…`` (256 random bits)."""
    return f"{prefix}_{secrets.token_urlsafe(32)}"


class StateLock:
    """This server's hold on its state directory: one server per directory.

    A second server on the same directory would keep its own copy of what is
    revoked and never see the first one's revocations. The lock is the
    kernel's (``flock``), so it goes with the process however it ends.
    """

    def __init__(self, state: Path) -> None:
        try:
            state.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._fd: int | None = os.open(state / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise ConfigError(f"cannot use state directory {state}: {exc.strerror}") from exc
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            self.release()
            raise ConfigError(
                f"another tunnel-server is using the state directory {state}: "
                "stop it first (two servers on one state would not see each other's "
                "revocations)"
            ) from exc

    def release(self) -> None:
        """Let another server have the directory (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def prepare_state_dir(settings: ServerSettings, now: datetime) -> ServerIdentity:
    """Create or load the CA and the serving certificate."""
    state = settings.state_dir
    try:
        state.mkdir(parents=True, exist_ok=True, mode=0o700)
        _keep_private(state)
        tls = settings.tls
        if tls.ca_cert_file is not None and tls.ca_key_file is not None:
            # Shared by the replicas of one database (a mounted Secret): never created here.
            ca = CertificateAuthority.load(
                tls.ca_cert_file.read_bytes(), tls.ca_key_file.read_bytes()
            )
        else:
            ca = _load_or_create_ca(state, now)
        if settings.tls.cert_file is not None and settings.tls.key_file is not None:
            cert_pem = settings.tls.cert_file.read_bytes()
            key_pem = settings.tls.key_file.read_bytes()
            bundle = _client_bundle(cert_pem, settings.tls.ca_file)
        else:
            cert_pem, key_pem = _load_or_issue_server_cert(state, ca, settings, now)
            bundle = ca.cert_pem
    except OSError as exc:
        raise ConfigError(f"cannot use state directory {state}: {exc.strerror}") from exc
    except PkiError as exc:
        raise ConfigError(f"state directory {state}: {exc}") from exc
    return ServerIdentity(ca, cert_pem, key_pem, bundle)


async def ensure_admin(store: Store, state_dir: Path, now: datetime) -> Path | None:
    """On first start, create the admin user and write its token to ``admin-token``.

    Returns the token file's path when one was written. The token itself is
    never logged.
    """
    try:
        await store.add_user(ADMIN_USER, (), True, now)
    except AlreadyExistsError:
        return None
    token = new_token("tat")
    await store.add_api_token(hash_token(token), ADMIN_USER, now)
    path = state_dir / "admin-token"
    write_private_file(path, token.encode() + b"\n")
    logger.info("created the admin API token; it is in %s (mode 0600)", path)
    return path


def _load_or_create_ca(state: Path, now: datetime) -> CertificateAuthority:
    cert_path, key_path = state / "ca.crt", state / "ca.key"
    if cert_path.exists() and key_path.exists():
        return CertificateAuthority.load(cert_path.read_bytes(), key_path.read_bytes())
    if cert_path.exists() or key_path.exists():
        raise ConfigError(f"{state} has only one of ca.crt and ca.key; restore both from backup")
    ca = CertificateAuthority.create(now=now)
    write_private_file(key_path, ca.key_pem)
    cert_path.write_bytes(ca.cert_pem)
    logger.info("created a new CA in %s", state)
    return ca


def _load_or_issue_server_cert(
    state: Path, ca: CertificateAuthority, settings: ServerSettings, now: datetime
) -> tuple[bytes, bytes]:
    cert_path, key_path = state / "server.crt", state / "server.key"
    hosts = _server_hosts(settings)
    if cert_path.exists() and key_path.exists():
        cert_pem = cert_path.read_bytes()
        if _still_good(cert_pem, hosts, now):
            return cert_pem, key_path.read_bytes()
    issued = ca.issue_server_certificate(hosts, settings.identity.server_cert_lifetime, now=now)
    assert issued.key_pem is not None
    write_private_file(key_path, issued.key_pem)
    cert_path.write_bytes(issued.cert_pem)
    logger.info("issued a serving certificate for %s", ", ".join(hosts))
    return issued.cert_pem, issued.key_pem


def _server_hosts(settings: ServerSettings) -> list[str]:
    hosts = [settings.listen.public_host, "localhost", "127.0.0.1", "::1"]
    return list(dict.fromkeys(hosts))


def _still_good(cert_pem: bytes, hosts: list[str], now: datetime) -> bool:
    cert = load_certificate(cert_pem)
    if cert.not_valid_after_utc - now < _RENEW_BEFORE:
        return False
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    names = {str(name.value) for name in san}
    return all(host in names for host in hosts)


def _client_bundle(cert_pem: bytes, ca_file: Path | None) -> bytes:
    if ca_file is not None:
        return ca_file.read_bytes()
    chain = load_certificate_bundle(cert_pem)
    if len(chain) < 2:
        raise ConfigError(
            "--tls-cert holds no CA certificate after the server's own; "
            "give the bundle clients should trust with --tls-ca"
        )
    return b"".join(certificate_pem(cert) for cert in chain[1:])
