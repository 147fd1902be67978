"""Where the agent keeps its key and certificate: a Kubernetes Secret or a directory.

The private key is generated in the agent and stays in its cluster: in the
Secret (the default in a cluster) or in a mode-0600 file (outside one).
"""

from __future__ import annotations

import asyncio
import base64
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from tunnel_pki.certs import load_certificate
from tunnel_pki.errors import PkiError
from tunnel_pki.files import write_private_file, write_private_files

from .errors import CredentialsError

__all__ = [
    "CredentialStore",
    "Credentials",
    "DirectoryCredentialStore",
    "SecretCredentialStore",
]

_KEY, _CERT, _CA, _CLUSTER = "tls.key", "tls.crt", "ca.crt", "cluster"
_JOURNAL = "commands.json"
#: The order the files of a credentials directory replace their old ones.
_ORDER = (_KEY, _CA, _CLUSTER, _CERT)


@dataclass(frozen=True, slots=True)
class Credentials:
    """The agent's identity: its cluster, key, certificate and the issuing CA."""

    cluster: str
    key_pem: bytes
    cert_pem: bytes
    ca_pem: bytes

    def __repr__(self) -> str:  # never show the key
        return f"Credentials(cluster={self.cluster!r})"

    @property
    def not_before(self) -> datetime:
        return load_certificate(self.cert_pem).not_valid_before_utc

    @property
    def not_after(self) -> datetime:
        return load_certificate(self.cert_pem).not_valid_after_utc

    @property
    def serial(self) -> int:
        return load_certificate(self.cert_pem).serial_number

    def as_files(self) -> dict[str, bytes]:
        return {
            _KEY: self.key_pem,
            _CERT: self.cert_pem,
            _CA: self.ca_pem,
            _CLUSTER: self.cluster.encode(),
        }

    @classmethod
    def from_files(cls, files: dict[str, bytes], where: str) -> Credentials:
        missing = [name for name in (_KEY, _CERT, _CA, _CLUSTER) if not files.get(name)]
        if missing:
            raise CredentialsError(
                f"{where} lacks {', '.join(missing)}; delete it to bootstrap again"
            )
        credentials = cls(files[_CLUSTER].decode().strip(), files[_KEY], files[_CERT], files[_CA])
        try:
            load_certificate(credentials.cert_pem)
        except PkiError as exc:
            raise CredentialsError(f"{where} holds an unreadable certificate: {exc}") from exc
        return credentials


class CredentialStore(Protocol):
    """Loads and saves the agent's credentials."""

    @property
    def description(self) -> str: ...

    async def load(self) -> Credentials | None: ...

    async def save(self, credentials: Credentials) -> None: ...

    async def load_journal(self) -> bytes | None: ...

    async def save_journal(self, data: bytes) -> None: ...


class DirectoryCredentialStore:
    """Credentials as files in a directory (outside a cluster); the key is mode 0600."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @property
    def description(self) -> str:
        return f"directory {self.directory}"

    async def load(self) -> Credentials | None:
        return await asyncio.to_thread(self._load)

    async def save(self, credentials: Credentials) -> None:
        await asyncio.to_thread(self._save, credentials)

    async def load_journal(self) -> bytes | None:
        path = self.directory / _JOURNAL
        try:
            return await asyncio.to_thread(path.read_bytes) if path.exists() else None
        except OSError as exc:
            raise CredentialsError(f"cannot read {path}: {exc.strerror}") from exc

    async def save_journal(self, data: bytes) -> None:
        path = self.directory / _JOURNAL
        try:
            await asyncio.to_thread(self.directory.mkdir, parents=True, exist_ok=True, mode=0o700)
            await asyncio.to_thread(write_private_file, path, data)
        except OSError as exc:
            raise CredentialsError(f"cannot write {path}: {exc.strerror}") from exc

    def _load(self) -> Credentials | None:
        if not (self.directory / _CERT).exists():
            return None
        try:
            files = {
                name: (self.directory / name).read_bytes()
                for name in (_KEY, _CERT, _CA, _CLUSTER)
                if (self.directory / name).exists()
            }
        except OSError as exc:
            raise CredentialsError(f"cannot read {self.description}: {exc.strerror}") from exc
        return Credentials.from_files(files, self.description)

    def _save(self, credentials: Credentials) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            # All written before any replaces its old one (a full disk leaves
            # the old pair whole), the certificate last: a reader never finds
            # a certificate without its key.
            files = credentials.as_files()
            write_private_files(self.directory, {name: files[name] for name in _ORDER})
        except OSError as exc:
            raise CredentialsError(f"cannot write {self.description}: {exc.strerror}") from exc


class SecretCredentialStore:
    """Credentials in a Kubernetes Secret of the agent's namespace (the default)."""

    def __init__(self, api_client: Any, namespace: str, name: str) -> None:
        self._api_client = api_client
        self.namespace = namespace
        self.name = name

    @property
    def description(self) -> str:
        return f"secret {self.namespace}/{self.name}"

    async def load(self) -> Credentials | None:
        files = await self._read(self.name)
        return None if files is None else Credentials.from_files(files, self.description)

    async def load_journal(self) -> bytes | None:
        files = await self._read(self.journal_name)
        return None if files is None else files.get(_JOURNAL)

    async def save_journal(self, data: bytes) -> None:
        await self._write(self.journal_name, {_JOURNAL: data})

    @property
    def journal_name(self) -> str:
        return f"{self.name}-commands"

    async def _read(self, name: str) -> dict[str, bytes] | None:
        from kubernetes_asyncio import client

        api = client.CoreV1Api(self._api_client)
        try:
            secret = await api.read_namespaced_secret(name, self.namespace)
        except client.exceptions.ApiException as exc:
            if exc.status == 404:
                return None
            raise CredentialsError(
                f"cannot read secret {self.namespace}/{name}: HTTP {exc.status}"
            ) from exc
        except OSError as exc:
            raise CredentialsError(f"cannot reach the Kubernetes API: {exc}") from exc
        try:
            return {key: base64.b64decode(value) for key, value in (secret.data or {}).items()}
        except ValueError as exc:
            raise CredentialsError(f"secret {self.namespace}/{name} holds invalid base64") from exc

    async def _write(self, name: str, files: dict[str, bytes]) -> None:
        from kubernetes_asyncio import client

        api = client.CoreV1Api(self._api_client)
        body = client.V1Secret(
            metadata=client.V1ObjectMeta(
                name=name,
                namespace=self.namespace,
                labels={"app.kubernetes.io/name": "tunnel-agent"},
            ),
            type="Opaque",
            data={key: base64.b64encode(value).decode() for key, value in files.items()},
        )
        try:
            try:
                await api.replace_namespaced_secret(name, self.namespace, body)
            except client.exceptions.ApiException as exc:
                if exc.status != 404:
                    raise
                await api.create_namespaced_secret(self.namespace, body)
        except client.exceptions.ApiException as exc:
            raise CredentialsError(
                f"cannot write secret {self.namespace}/{name}: HTTP {exc.status}; "
                "the agent's Role must allow create, update on it"
            ) from exc
        except OSError as exc:
            raise CredentialsError(f"cannot reach the Kubernetes API: {exc}") from exc

    async def save(self, credentials: Credentials) -> None:
        await self._write(self.name, credentials.as_files())
