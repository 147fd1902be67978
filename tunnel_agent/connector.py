"""The agent's life: credentials, then one outbound mTLS WebSocket, kept up.

First start trades the bootstrap token for a certificate; later starts reuse
the stored one. The connection loop backs off with full jitter and a cap,
obeys a server's Retry-After, and stops (with a message a person can act on)
only when retrying cannot help: a revoked certificate, a refused token. The
certificate is renewed over the live socket at half its lifetime.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import aiohttp

from protocol import Connection, Side, kinds
from tunnel_mux import MuxStream, Session, SessionError, SessionHandlers, WebSocketTransport
from tunnel_pki.certs import load_certificate
from tunnel_pki.csr import make_csr
from tunnel_pki.errors import PkiError
from tunnel_pki.keys import (
    generate_private_key,
    load_private_key,
    private_key_to_pem,
    public_key_der,
)
from tunnel_pki.tls import client_context
from tunnel_pki.validity import certificate_lifetime_fraction

from . import __version__
from .backoff import Backoff
from .config import AgentSettings
from .credentials import Credentials, CredentialStore
from .errors import (
    AgentConfigError,
    AgentError,
    AgentRejectedError,
    BootstrapRefusedError,
    ConnectError,
    ServerCertificateError,
    TlsInterceptionError,
)
from .proxy import proxy_for

__all__ = ["Agent"]

logger = logging.getLogger(__name__)

StreamHandler = Callable[[MuxStream], Awaitable[None]]
MessageHandler = Callable[[str, dict[str, Any]], None]

#: How long the agent waits for the server to answer a renewal request.
RENEWAL_ANSWER_TIMEOUT = 60.0


class Agent:
    """Runs the agent until a person must act (then raises AgentStoppedError)."""

    def __init__(
        self,
        settings: AgentSettings,
        store: CredentialStore,
        *,
        on_stream: StreamHandler | None = None,
        on_message: MessageHandler | None = None,
        on_connected: Callable[[Session], None] | None = None,
        on_disconnected: Callable[[], None] | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.on_stream = on_stream
        self.on_message = on_message
        self.on_connected = on_connected
        self.on_disconnected = on_disconnected
        connect = settings.connect
        self.backoff = backoff or Backoff(
            base=connect.backoff_base, cap=connect.backoff_cap, stable_after=connect.stable_after
        )
        #: Set while a session is up (readiness).
        self.connected = asyncio.Event()
        #: Sessions established since start, and bootstraps done.
        self.connections = 0
        self.bootstraps = 0
        self.renewals = 0
        self.failed_attempts = 0
        self.session: Session | None = None
        self.last_error: str | None = None
        self._credentials: Credentials | None = None
        self._renewal: asyncio.Future[tuple[bytes, bytes]] | None = None
        self._ssl_cache: tuple[bytes | None, ssl.SSLContext] | None = None
        self._rebootstrapped = False
        #: More HELLO info, what the agent knows of its cluster (its Kubernetes version).
        self.facts: dict[str, str] = {}

    @property
    def credentials(self) -> Credentials | None:
        return self._credentials

    async def run(self) -> None:
        """Connect and stay connected; raises AgentStoppedError when it must stop."""
        self._credentials = await self._ready_credentials()
        while True:
            started = time.monotonic()
            retry_after: float | None = None
            try:
                await self._serve_one_connection(self._credentials)
                self.last_error = "the connection ended"
            except AgentRejectedError as exc:
                # A reinstall brings a new bootstrap token while the old,
                # revoked certificate is still stored: trade the token once.
                self._credentials = await self._bootstrap_after_rejection(exc)
                continue
            except ConnectError as exc:
                self.failed_attempts += 1
                self.last_error = str(exc)
                retry_after = exc.retry_after
                logger.warning("cannot connect: %s", exc, extra={"cluster": self.settings.cluster})
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                # Asked to stop while a connection failed, and the failure was
                # raised instead: stop, rather than wait and connect again.
                raise asyncio.CancelledError
            self.backoff.connection_ended(time.monotonic() - started)
            delay = self.backoff.next_delay(retry_after)
            logger.info("reconnecting in %.1fs", delay, extra={"cluster": self.settings.cluster})
            await asyncio.sleep(delay)
            if self._expired(self._credentials):
                self._credentials = await self._ready_credentials()

    # ---------------------------------------------------------------- credentials

    async def _bootstrap_after_rejection(self, rejection: AgentRejectedError) -> Credentials:
        if self.settings.bootstrap_token is None or self._rebootstrapped:
            raise rejection
        self._rebootstrapped = True
        logger.warning(
            "%s; trying the bootstrap token for a new certificate",
            rejection,
            extra={"cluster": self.settings.cluster},
        )
        try:
            return await self._bootstrap_with_retries()
        except BootstrapRefusedError as exc:
            raise AgentRejectedError(
                f"{rejection}; the bootstrap token did not help either ({exc}). Issue a new "
                f"token with `tunnelctl cluster token {self.settings.cluster}` and apply the "
                "manifest it prints"
            ) from exc

    async def _ready_credentials(self) -> Credentials:
        credentials = await self.store.load()
        if credentials is not None and credentials.cluster != self.settings.cluster:
            raise AgentConfigError(
                f"{self.store.description} belongs to cluster {credentials.cluster}, "
                f"not {self.settings.cluster}; delete it to bootstrap this cluster"
            )
        if credentials is not None and not self._expired(credentials):
            logger.info("using stored credentials from %s", self.store.description)
            return credentials
        if self.settings.bootstrap_token is None:
            what = "expired" if credentials is not None else "missing"
            raise AgentConfigError(
                f"credentials in {self.store.description} are {what} and there is no "
                "bootstrap token; issue one with `tunnelctl cluster token "
                f"{self.settings.cluster}` and apply the manifest it prints"
            )
        return await self._bootstrap_with_retries()

    @staticmethod
    def _expired(credentials: Credentials) -> bool:
        return credentials.not_after <= datetime.now(UTC)

    async def _bootstrap_with_retries(self) -> Credentials:
        while True:
            try:
                credentials = await self._bootstrap()
            except ConnectError as exc:
                self.last_error = f"bootstrap failed: {exc}"
                delay = self.backoff.next_delay(exc.retry_after)
                logger.warning("bootstrap failed: %s; retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                continue
            await self.store.save(credentials)
            self.bootstraps += 1
            logger.info(
                "bootstrapped; certificate stored in %s, valid until %s",
                self.store.description,
                credentials.not_after.isoformat(),
                extra={"cluster": credentials.cluster},
            )
            return credentials

    async def _bootstrap(self) -> Credentials:
        settings = self.settings
        assert settings.bootstrap_token is not None
        key = generate_private_key()
        body = {
            "cluster": settings.cluster,
            "token": settings.bootstrap_token,
            "csr": make_csr(key, settings.cluster).decode(),
        }
        ssl_context = self._ssl_context(None)
        url = settings.server_url.rstrip("/") + kinds.PATH_BOOTSTRAP
        async with self._http() as http:
            try:
                async with http.post(url, json=body, ssl=ssl_context) as response:
                    answer = await _json_answer(response)
            except ssl.SSLCertVerificationError as exc:
                raise self._certificate_error(exc) from exc
            except aiohttp.ClientConnectorCertificateError as exc:
                raise self._certificate_error(exc.certificate_error) from exc
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                raise ConnectError(f"cannot reach {settings.server_url}: {exc}") from exc
        if response.status in (401, 403, 409):
            raise BootstrapRefusedError(
                f"the server refused the bootstrap token: {_message(answer)}"
            )
        if response.status != 200:
            raise ConnectError(
                f"bootstrap answered HTTP {response.status}: {_message(answer)}",
                retry_after=_retry_after(response.headers),
            )
        try:
            cert_pem = str(answer["certificate"]).encode()
            ca_pem = str(answer["ca"]).encode()
        except (KeyError, TypeError) as exc:
            raise ConnectError("bootstrap answer lacks the certificate") from exc
        credentials = Credentials(settings.cluster, private_key_to_pem(key), cert_pem, ca_pem)
        _check_key_matches(credentials)
        return credentials

    # ------------------------------------------------------------- connection

    async def _serve_one_connection(self, credentials: Credentials) -> None:
        settings = self.settings
        connect = settings.connect
        url = settings.server_url.rstrip("/") + kinds.PATH_AGENT_CONNECT
        ssl_context = self._ssl_context(credentials)
        async with self._http() as http:
            try:
                # asyncio.timeout, not wait_for: on Python 3.11, wait_for turns a
                # cancellation that meets a failed connect into that failure.
                async with asyncio.timeout(connect.connect_timeout):
                    websocket = await http.ws_connect(
                        url,
                        ssl=ssl_context,
                        max_msg_size=connect.limits.message_limit,
                        autoping=True,
                        heartbeat=None,
                        compress=0,
                    )
            except aiohttp.WSServerHandshakeError as exc:
                raise await self._refusal(http, url, ssl_context, exc) from exc
            except aiohttp.ClientConnectorCertificateError as exc:
                raise self._certificate_error(exc.certificate_error) from exc
            except ssl.SSLCertVerificationError as exc:
                raise self._certificate_error(exc) from exc
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                raise ConnectError(f"cannot reach {settings.server_url}: {exc}") from exc
            await self._serve(websocket, credentials)

    async def _serve(
        self, websocket: aiohttp.ClientWebSocketResponse, credentials: Credentials
    ) -> None:
        settings = self.settings
        session = Session(
            WebSocketTransport(websocket),
            Connection(
                Side.CLIENT,
                settings.connect.limits,
                keepalive=settings.connect.keepalive,
                info={
                    kinds.INFO_AGENT_VERSION: __version__,
                    kinds.INFO_CLUSTER: settings.cluster,
                    kinds.INFO_POD: socket.gethostname()[:64],
                    **self.facts,
                },
                # The server is trusted with this cluster's availability (a
                # compromised one could send real requests instead), and a
                # caller's unusual requests (30 KiB heads, many at once) must
                # not cut every caller off: the server enforces, the agent counts.
                enforce_allowance=False,
            ),
            handlers=SessionHandlers(on_stream=self.on_stream, on_message=self._on_message),
            label=f"cluster={settings.cluster}",
        )
        run = asyncio.create_task(session.run(), name="agent session")
        renewer: asyncio.Task[None] | None = None
        try:
            try:
                async with asyncio.timeout(settings.connect.handshake_timeout):
                    await session.wait_ready()
            except (TimeoutError, SessionError) as exc:
                raise ConnectError(f"the server did not complete the handshake: {exc}") from exc
            self.session = session
            self.connections += 1
            self.connected.set()
            self.last_error = None
            logger.info("connected to %s", settings.server_url, extra={"cluster": settings.cluster})
            renewer = asyncio.create_task(self._renew_when_due(session, credentials))
            if self.on_connected is not None:
                self.on_connected(session)
            await asyncio.shield(run)
            logger.warning(
                "disconnected: %s", session.close_reason, extra={"cluster": settings.cluster}
            )
        finally:
            self.connected.clear()
            self.session = None
            if self.on_disconnected is not None:
                self.on_disconnected()
            if renewer is not None:
                renewer.cancel()
                await asyncio.gather(renewer, return_exceptions=True)
            if not run.done():
                await session.close()
            await run

    async def _refusal(
        self,
        http: aiohttp.ClientSession,
        url: str,
        ssl_context: ssl.SSLContext,
        exc: aiohttp.WSServerHandshakeError,
    ) -> AgentError:
        headers: Any = exc.headers or {}
        if exc.status == 503:
            return ConnectError(
                "the server is busy and asked the agent to wait",
                retry_after=_retry_after(headers),
            )
        if exc.status in (401, 403):
            reason = await self._reason(http, url, ssl_context, exc.status)
            return AgentRejectedError(f"the server refused this agent: {reason}")
        if exc.status == 409:
            # Another connection of this cluster serves (agent_takeover_refused): not
            # final, since the one refused may be the real agent; wait as told.
            reason = await self._reason(http, url, ssl_context, exc.status)
            return ConnectError(
                f"the server refused this connection for now: {reason}",
                retry_after=_retry_after(headers),
            )
        return ConnectError(f"the server refused the WebSocket upgrade: HTTP {exc.status}")

    async def _reason(
        self, http: aiohttp.ClientSession, url: str, ssl_context: ssl.SSLContext, status: int
    ) -> str:
        """Why the server refused: the upgrade answer has no body, so ask again without one."""
        try:
            async with http.get(url, ssl=ssl_context) as response:
                return _message(await _json_answer(response))
        except (aiohttp.ClientError, OSError, TimeoutError):
            return f"HTTP {status}"

    def _certificate_error(self, exc: BaseException) -> ServerCertificateError:
        detail = getattr(exc, "verify_message", None) or str(exc)
        proxy = proxy_for(self.settings.server_url)
        if proxy is not None:
            return TlsInterceptionError(
                f"the certificate presented for {self.settings.server_url} does not chain to "
                f"the pinned CA ({detail}); the proxy {proxy} is intercepting TLS. Exempt the "
                "tunnel server's host from TLS inspection (or from the proxy with NO_PROXY)"
            )
        return ServerCertificateError(
            f"the certificate presented for {self.settings.server_url} does not chain to the "
            f"pinned CA ({detail}); check --ca, or something is impersonating the server"
        )

    # ---------------------------------------------------------------- renewal

    async def _renew_when_due(self, session: Session, credentials: Credentials) -> None:
        renew_at = self.settings.connect.renew_at
        while True:
            now = datetime.now(UTC)
            fraction = certificate_lifetime_fraction(
                credentials.not_before, credentials.not_after, now
            )
            if fraction < renew_at:
                lifetime = credentials.not_after - credentials.not_before
                due = credentials.not_before + lifetime * renew_at
                await asyncio.sleep(min(max((due - now).total_seconds(), 0.0), 3600.0))
                continue
            try:
                credentials = await self._renew(session, credentials)
            except (AgentError, PkiError, TimeoutError) as exc:
                remaining = (credentials.not_after - now).total_seconds()
                retry = min(300.0, max(1.0, remaining / 20))
                logger.warning("certificate renewal failed: %s; retrying in %.0fs", exc, retry)
                await asyncio.sleep(retry)

    async def _renew(self, session: Session, credentials: Credentials) -> Credentials:
        key = generate_private_key()
        csr = make_csr(key, credentials.cluster)
        self._renewal = asyncio.get_running_loop().create_future()
        try:
            session.send_message(kinds.MESSAGE_CERT_RENEW, {"csr": csr.decode()})
            cert_pem, ca_pem = await asyncio.wait_for(self._renewal, RENEWAL_ANSWER_TIMEOUT)
        except SessionError as exc:
            raise ConnectError(f"the session ended during renewal: {exc}") from exc
        finally:
            self._renewal = None
        renewed = Credentials(credentials.cluster, private_key_to_pem(key), cert_pem, ca_pem)
        _check_key_matches(renewed)
        await self.store.save(renewed)
        self._credentials = renewed
        self.renewals += 1
        logger.info(
            "renewed the certificate over the live connection; valid until %s",
            renewed.not_after.isoformat(),
            extra={"cluster": credentials.cluster},
        )
        return renewed

    def _on_message(self, kind: str, body: dict[str, Any]) -> None:
        if kind not in (kinds.MESSAGE_CERT_ISSUED, kinds.MESSAGE_CERT_REFUSED):
            if self.on_message is not None:
                self.on_message(kind, body)
            return
        future = self._renewal
        if future is None or future.done():
            return
        if kind == kinds.MESSAGE_CERT_ISSUED:
            certificate, ca = body.get("certificate"), body.get("ca")
            if isinstance(certificate, str) and isinstance(ca, str):
                future.set_result((certificate.encode(), ca.encode()))
            else:
                future.set_exception(ConnectError("the renewal answer lacks the certificate"))
        elif kind == kinds.MESSAGE_CERT_REFUSED:
            future.set_exception(ConnectError(f"the server refused renewal: {body.get('message')}"))

    # ---------------------------------------------------------------- helpers

    def _ssl_context(self, credentials: Credentials | None) -> ssl.SSLContext:
        # Building a context costs milliseconds (files, key parsing); a fleet
        # retrying after an outage should not pay it on every attempt.
        key = None if credentials is None else credentials.cert_pem
        cached = self._ssl_cache
        if cached is not None and cached[0] == key:
            return cached[1]
        try:
            if credentials is None:
                context = client_context(self.settings.ca_pem)
            else:
                context = client_context(
                    self.settings.ca_pem,
                    cert_pem=credentials.cert_pem,
                    key_pem=credentials.key_pem,
                )
        except PkiError as exc:
            raise AgentConfigError(f"cannot set up TLS: {exc}") from exc
        self._ssl_cache = (key, context)
        return context

    def _http(self) -> aiohttp.ClientSession:
        # trust_env: HTTPS_PROXY / NO_PROXY (with user:password in the URL) apply.
        return aiohttp.ClientSession(
            trust_env=True,
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=self.settings.connect.connect_timeout
            ),
        )


def _check_key_matches(credentials: Credentials) -> None:
    certificate = load_certificate(credentials.cert_pem)
    key = load_private_key(credentials.key_pem)
    if public_key_der(certificate.public_key()) != public_key_der(key.public_key()):
        raise ConnectError("the server returned a certificate for another key")


async def _json_answer(response: aiohttp.ClientResponse) -> Any:
    body = await response.content.read(64 * 1024)
    try:
        return json.loads(body)
    except ValueError:
        return {"error": {"message": body[:200].decode(errors="replace")}}


def _message(answer: Any) -> str:
    if isinstance(answer, dict):
        error = answer.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])[:300]
    return "no reason given"


def _retry_after(headers: Any) -> float | None:
    value = headers.get("Retry-After") if headers is not None else None
    try:
        return max(0.0, min(float(value), 3600.0)) if value is not None else None
    except ValueError:
        return None
