"""The agent's way to its cluster's Kubernetes API server.

Credentials come from the in-cluster service account (whose token
kubernetes_asyncio re-reads as the kubelet rotates it) or from a kubeconfig,
through kubernetes_asyncio's loaders. :class:`KubeApi` keeps the aiohttp
sessions that send raw HTTP with them; ``api_client()`` gives a
kubernetes_asyncio client for typed calls (Secrets, apply).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
from yarl import URL

from .errors import AgentConfigError

__all__ = ["CREDENTIAL_REUSE", "KubeApi", "load_kube_configuration"]

#: Seconds the agent's Authorization value is reused before it is asked for
#: again. kubernetes_asyncio re-reads a rotated service-account token (or runs
#: a kubeconfig's exec plugin) only when its own, longer, period is up; asking
#: it for every relayed request cost two coroutines and a dict each time.
CREDENTIAL_REUSE = 1.0
#: Seconds the agent waits at start for the API server to say its version.
VERSION_PATIENCE = 3.0


async def load_kube_configuration(kubeconfig: Path | None) -> Any:
    """A kubernetes_asyncio Configuration from a kubeconfig, or in-cluster."""
    from kubernetes_asyncio import client, config
    from kubernetes_asyncio.config.config_exception import ConfigException

    configuration = client.Configuration()
    try:
        if kubeconfig is not None:
            await config.load_kube_config(
                config_file=str(kubeconfig), client_configuration=configuration
            )
        else:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except (ConfigException, OSError, ValueError) as exc:
        where = kubeconfig or "the in-cluster service account"
        raise AgentConfigError(f"cannot load Kubernetes credentials from {where}: {exc}") from exc
    return configuration


class KubeApi:
    """Relays raw HTTP to the API server with the agent's own credentials."""

    def __init__(self, configuration: Any, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.configuration = configuration
        self.base_url = str(configuration.host).rstrip("/")
        self.ssl_context = _ssl_context(configuration)
        self._session: aiohttp.ClientSession | None = None
        self._single_use_session: aiohttp.ClientSession | None = None
        self._api_client: Any = None
        self._clock = clock
        self._authorization: str | None = None
        self._authorization_until = float("-inf")

    @property
    def session(self) -> aiohttp.ClientSession:
        """A session with pooled connections, for the commands' requests."""
        if self._session is None:
            self._session = _raw_session(self.ssl_context, force_close=False)
        return self._session

    @property
    def single_use_session(self) -> aiohttp.ClientSession:
        """A session whose connections serve one request each (upgrades and HEAD relayed).

        An upgrade takes its connection anyway; a HEAD is rare. Never reused,
        a connection cannot carry one request's framing into the next.
        """
        if self._single_use_session is None:
            self._single_use_session = _raw_session(self.ssl_context, force_close=True)
        return self._single_use_session

    def url(self, path: str) -> URL:
        """The API server URL of a relayed path, as it came (no re-encoding)."""
        return URL(self.base_url + path, encoded=True)

    async def authorization(self) -> str | None:
        """The agent's Authorization header value, refreshed as needed.

        Reused for :data:`CREDENTIAL_REUSE` seconds: a rotated token is sent
        at most that long after kubernetes_asyncio has read it.
        """
        now = self._clock()
        if now < self._authorization_until:
            return self._authorization
        settings = await self.configuration.auth_settings()
        bearer = settings.get("BearerToken")
        value = str(bearer["value"]) if bearer and bearer.get("value") else None
        self._authorization, self._authorization_until = value, now + CREDENTIAL_REUSE
        return value

    async def kubernetes_version(self) -> str | None:
        """The API server's version (``gitVersion`` of ``/version``), or None if it cannot
        say within :data:`VERSION_PATIENCE` seconds: a fact the agent tells the server."""
        headers = {}
        try:
            async with asyncio.timeout(VERSION_PATIENCE):
                authorization = await self.authorization()
                if authorization:
                    headers["Authorization"] = authorization
                async with self.session.get(
                    self.url("/version"), headers=headers, ssl=self.ssl_context
                ) as answer:
                    if answer.status != 200:
                        return None
                    body = await answer.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, ValueError, OSError):
            return None
        version = body.get("gitVersion") if isinstance(body, dict) else None
        return version[:64] if isinstance(version, str) and version.isprintable() else None

    def api_client(self) -> Any:
        """A kubernetes_asyncio ApiClient on the same credentials (shared)."""
        if self._api_client is None:
            from kubernetes_asyncio import client

            self._api_client = client.ApiClient(self.configuration)
        return self._api_client

    async def close(self) -> None:
        for session in (self._session, self._single_use_session):
            if session is not None:
                await session.close()
        self._session = self._single_use_session = None
        if self._api_client is not None:
            await self._api_client.close()
            self._api_client = None


def _raw_session(ssl_context: ssl.SSLContext | bool, *, force_close: bool) -> aiohttp.ClientSession:
    """An aiohttp session that sends what it is given and hands back what comes."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=ssl_context, limit=0, force_close=force_close),
        # No timeouts: watches, logs -f and exec stay open as long as the
        # tunnel does; the tunnel's keepalive finds dead peers.
        timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
        auto_decompress=False,
        skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept"),
    )


def _ssl_context(configuration: Any) -> ssl.SSLContext | bool:
    if not str(configuration.host).startswith("https"):
        return False
    if not configuration.verify_ssl:
        raise AgentConfigError(
            "the kubeconfig skips TLS verification of the API server; the agent refuses that"
        )
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
    context.set_alpn_protocols(["http/1.1"])
    if configuration.cert_file and configuration.key_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file)
    return context
