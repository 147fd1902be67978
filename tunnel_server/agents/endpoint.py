"""The agent socket: an mTLS WebSocket that carries one session per cluster.

The cluster's identity comes from the client certificate alone (issued by
this server's CA, in validity, not revoked); what the agent says in its HELLO
is recorded but never trusted. The agent renews its certificate over the same
socket with a ``cert.renew`` message. A newcomer of a cluster whose connections
from different addresses keep replacing each other is refused before its
upgrade (``takeovers``): logged, audited and counted, as a key held twice.
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from protocol import Connection, ErrorCode, Side, kinds
from protocol.errors import describe_code
from tunnel_cli.text import printable
from tunnel_mux import (
    MuxStream,
    PeerProtocolError,
    Session,
    SessionClosedError,
    SessionHandlers,
    SessionTimeoutError,
    WebSocketTransport,
)
from tunnel_pki.errors import PkiError
from tunnel_pki.identity import ClientIdentity, verify_client_certificate
from tunnel_server import __version__
from tunnel_server.agents.registry import AgentConnection
from tunnel_server.agents.takeovers import TakeoverRefusal
from tunnel_server.clock import utcnow
from tunnel_server.context import CONTEXT, ServerContext
from tunnel_server.errors import (
    ApiError,
    ConflictError,
    ForbiddenError,
    UnauthorizedError,
    UnavailableError,
)
from tunnel_server.store.base import AuditEvent, NotFoundError, StoreError

__all__ = [
    "AGENT_SOCKET_PATH",
    "TAKEOVER_REFUSED",
    "agent_socket",
    "client_identity",
    "setup_agent_socket",
]

logger = logging.getLogger(__name__)

AGENT_SOCKET_PATH = kinds.PATH_AGENT_CONNECT


#: What to do about a revoked agent certificate.
_REINSTALL = "reinstall the agent with a new bootstrap token (tunnelctl cluster token)"

#: The audit verb (kind ``admin``) of a newcomer refused because agents flap.
TAKEOVER_REFUSED = "agent.takeover-refused"


class _Admission:
    """Agent handshakes in progress (to refuse a reconnect storm politely), and renewals."""

    def __init__(self) -> None:
        self.pending = 0
        #: When each cluster's certificate was last renewed (event loop time).
        self.renewed: dict[str, float] = {}


_ADMISSION: web.AppKey[_Admission] = web.AppKey("agent_admission", _Admission)


def client_identity(request: web.Request, context: ServerContext) -> ClientIdentity:
    """The agent identity of the request's client certificate, or 401/403."""
    ssl_object = request.transport.get_extra_info("ssl_object") if request.transport else None
    der = (
        ssl_object.getpeercert(binary_form=True) if isinstance(ssl_object, ssl.SSLObject) else None
    )
    if not der:
        raise UnauthorizedError(
            "the agent socket needs a client certificate; bootstrap the agent first",
            code="client_certificate_required",
        )
    try:
        identity = verify_client_certificate(der, context.identity.ca.certificate, utcnow())
    except PkiError as exc:
        raise ForbiddenError(
            f"client certificate refused: {exc}", code="certificate_invalid"
        ) from exc
    if identity.serial in context.revoked:
        raise ForbiddenError(
            f"the certificate of cluster {identity.cluster} was revoked; {_REINSTALL}",
            code="certificate_revoked",
        )
    return identity


async def agent_socket(request: web.Request) -> web.StreamResponse:
    """Accept an agent's WebSocket and run its session until it ends."""
    context = request.app[CONTEXT]
    try:
        return await _accept_agent(request, context)
    except ApiError as exc:
        context.metrics.agent_refusals.labels(exc.code).inc()
        raise


async def _accept_agent(request: web.Request, context: ServerContext) -> web.StreamResponse:
    settings = context.settings.tunnel
    identity = client_identity(request, context)
    admission = request.app[_ADMISSION]
    # Checked before anything costly, and counted only while this server
    # works on the agent (not while the agent's HELLO is on its way).
    if admission.pending >= settings.max_pending_handshakes:
        # Full jitter: refused agents come back spread over the window.
        raise UnavailableError(
            "too many agents are connecting at once",
            retry_after=random.uniform(1.0, settings.max_retry_after),  # noqa: S311 - jitter
            code="busy",
        )
    refusal = context.registry.admit(identity.cluster, request.remote)
    if refusal is not None:
        await _refuse_takeover(context, identity, refusal)
    admission.pending += 1
    try:
        try:
            await context.store.get_cluster(identity.cluster)
        except NotFoundError as exc:
            raise ForbiddenError(
                f"cluster {identity.cluster} is not registered on this server",
                code="cluster_unknown",
            ) from exc
        websocket = web.WebSocketResponse(
            timeout=settings.close_timeout,
            max_msg_size=settings.limits.message_limit,
            compress=False,
            autoping=True,
            heartbeat=None,  # the protocol's own PING keeps the socket alive
        )
        await websocket.prepare(request)
    finally:
        admission.pending -= 1
    renewals = _Renewals(context, identity.cluster, identity.serial, admission.renewed)
    session = Session(
        WebSocketTransport(websocket),
        Connection(
            Side.SERVER,
            settings.limits,
            keepalive=settings.keepalive,
            info={kinds.INFO_SERVER_VERSION: __version__},
            # Refused in the protocol, without a task each: an agent opening
            # others at full speed costs the server no more than a WINDOW.
            stream_kinds={kinds.STREAM_COMMAND_REPORT},
        ),
        handlers=SessionHandlers(
            on_stream=_reports_of(context, identity.cluster),
            on_message=renewals.on_message,
        ),
        label=f"cluster={identity.cluster}",
    )
    renewals.session = session
    context.metrics.track(session)
    run = asyncio.create_task(session.run(), name=f"session {identity.cluster}")
    try:
        hello = await asyncio.wait_for(session.wait_ready(), settings.handshake_timeout)
    except (TimeoutError, SessionClosedError):
        return await _never_attached(context, session, run, websocket)
    if identity.serial in context.revoked:
        # Revoked while its HELLO was on the way: a revocation disconnects the
        # agents attached, so this one must not attach after it.
        reason = "the cluster's certificates were revoked"
        return await _never_attached(context, session, run, websocket, reason)
    try:
        # The newest session of a cluster serves it, on whichever replica it is.
        epoch = await context.replicas.claim(identity.cluster)
    except StoreError as exc:
        logger.warning(
            "cannot record the agent's session: %s", exc, extra={"cluster": identity.cluster}
        )
        reason = "the server cannot record the session now; connect again shortly"
        return await _never_attached(context, session, run, websocket, reason)
    agent = AgentConnection(
        cluster=identity.cluster,
        session=session,
        serial=identity.serial,
        agent_version=_claim(hello.peer_info, kinds.INFO_AGENT_VERSION),
        remote_addr=request.remote,
        connected_since=utcnow(),
        epoch=epoch,
        kubernetes_version=_claim(hello.peer_info, kinds.INFO_KUBERNETES_VERSION),
        pod=_claim(hello.peer_info, kinds.INFO_POD),
    )
    context.registry.attach(agent)
    context.metrics.agent_connects.inc()
    context.commands.kick(identity.cluster)  # deliver what waited for this agent
    log = {"cluster": identity.cluster, "remote": request.remote}
    logger.info("agent connected (version %s)", agent.agent_version, extra=log)
    await _record(context, agent, connected=True)
    try:
        await run
    finally:
        context.registry.detach(agent)
        context.metrics.untrack(session)
        await context.replicas.release(identity.cluster, epoch)
        error = session.close_error
        if isinstance(error, SessionTimeoutError):
            context.metrics.agent_timeouts.inc()
        elif isinstance(error, PeerProtocolError):
            context.metrics.agent_protocol_errors.labels(describe_code(error.code)).inc()
        await renewals.close()
        logger.info("agent disconnected: %s", printable(str(session.close_reason)), extra=log)
        if not agent.fenced:  # else the replica that holds it now has recorded it
            await _record(context, agent, connected=False)
    return websocket


async def _never_attached(
    context: ServerContext,
    session: Session,
    run: asyncio.Task[None],
    websocket: web.WebSocketResponse,
    reason: str = "",
) -> web.WebSocketResponse:
    """End a session that is not attached: no HELLO in time, or revoked meanwhile."""
    await session.close(ErrorCode.NO_ERROR, reason)
    await run
    context.metrics.untrack(session)
    return websocket


async def _refuse_takeover(
    context: ServerContext, identity: ClientIdentity, refusal: TakeoverRefusal
) -> None:
    """Report a newcomer refused for flapping, and raise its 409 (with Retry-After)."""
    cluster = identity.cluster
    context.metrics.agent_takeovers_refused.labels(refusal.reason).inc()
    log = {"cluster": cluster, "remote": refusal.newcomer}
    sources = ", ".join(refusal.sources)
    if refusal.reason == "flapping":
        # Once per back-off, not per attempt: a holder of the key that dials in a
        # loop must not flood the log or the trail. Addresses and counts only.
        serving = context.registry.get(cluster)
        logger.warning(
            "two agents seem to share cluster %s's certificate: connections from %s replaced "
            "each other %d times within %.0fs; refused the one from %s for %.0fs, the one "
            "from %s keeps serving. Revoke the cluster's certificates and reinstall its agent "
            "(docs/troubleshooting.md)",
            cluster,
            sources,
            refusal.takeovers,
            refusal.window,
            refusal.newcomer,
            refusal.retry_after,
            refusal.serving,
            extra=log,
        )
        await context.audit.record(
            AuditEvent(
                id=None,
                time=utcnow(),
                user=None,
                cluster=cluster,
                kind="admin",
                verb=TAKEOVER_REFUSED,
                path=cluster,
                status=ConflictError.status,
                detail={
                    "cluster": cluster,
                    "refused": refusal.newcomer,
                    "serving": refusal.serving,
                    "sources": list(refusal.sources),
                    "takeovers": refusal.takeovers,
                    "window_seconds": refusal.window,
                    "refused_for_seconds": refusal.retry_after,
                    "same_certificate": serving is not None and serving.serial == identity.serial,
                },
            )
        )
    else:
        logger.info(
            "refused an agent connection: cluster %s is in its back-off after its connections "
            "from %s flapped (%.0fs left)",
            cluster,
            sources,
            refusal.retry_after,
            extra=log,
        )
    # The newcomer may be the thief: it is not told where the cluster's agent is.
    raise ConflictError(
        f"another agent of cluster {cluster} is connected from another address, and the "
        "cluster's connections kept replacing each other: two agents seem to share one "
        "certificate (a copied Secret, or a stolen key). This connection is refused for "
        f"{refusal.retry_after:.0f}s; an admin should revoke the cluster's certificates "
        f"(tunnelctl cluster revoke {cluster}) and reinstall its agent",
        code="agent_takeover_refused",
        retry_after=refusal.retry_after,
    )


def setup_agent_socket(app: web.Application) -> None:
    app[_ADMISSION] = _Admission()
    app.router.add_get(AGENT_SOCKET_PATH, agent_socket)


def _reports_of(context: ServerContext, cluster: str) -> Callable[[MuxStream], Awaitable[None]]:
    """The handler of streams the agent opens: reports, the one kind its connection takes."""

    async def on_stream(stream: MuxStream) -> None:
        await context.commands.handle_report(cluster, stream)

    return on_stream


def _claim(info: dict[str, Any], key: str) -> str | None:
    """What the agent says of itself, bounded and printable (it goes to logs and the API)."""
    value = info.get(key)
    return printable(value[:64]) if isinstance(value, str) else None


async def _record(context: ServerContext, agent: AgentConnection, *, connected: bool) -> None:
    try:
        await context.store.record_connection(
            agent.cluster,
            agent.agent_version,
            agent.remote_addr,
            agent.connected_since if connected else None,
            utcnow(),
        )
    except StoreError as exc:
        logger.warning(
            "could not record the agent's connection: %s", exc, extra={"cluster": agent.cluster}
        )


#: Why a session whose certificate was revoked gets no new one.
REVOKED_SESSION = f"the certificate this agent connected with was revoked; {_REINSTALL}"


class _Renewals:
    """Signs renewal CSRs that arrive on one agent's session."""

    def __init__(
        self, context: ServerContext, cluster: str, serial: int, renewed: dict[str, float]
    ) -> None:
        self._context = context
        self._cluster = cluster
        #: The serial of the certificate the session was opened with.
        self._serial = serial
        #: When each cluster last renewed, shared by all sessions.
        self._renewed = renewed
        self.session: Session | None = None
        self._task: asyncio.Task[None] | None = None

    def on_message(self, kind: str, body: dict[str, Any]) -> None:
        if kind != kinds.MESSAGE_CERT_RENEW:
            logger.debug("ignored message %s", kind, extra={"cluster": self._cluster})
            return
        if self._task is not None and not self._task.done():
            return  # one renewal at a time; the agent asks again if needed
        self._task = asyncio.create_task(self._renew(body.get("csr")))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _renew(self, csr: object) -> None:
        context = self._context
        try:
            if not isinstance(csr, str):
                raise ForbiddenError("cert.renew needs a PEM csr")
            if self._serial in context.revoked:
                raise ForbiddenError(REVOKED_SESSION)
            self._check_spacing()
            now = utcnow()
            issued = context.identity.ca.sign_client_csr(
                csr.encode(), self._cluster, context.settings.identity.client_cert_lifetime, now
            )
            await context.store.record_certificate(
                issued.serial,
                self._cluster,
                issued.fingerprint,
                issued.not_before,
                issued.not_after,
            )
            if self._serial in await context.store.revoked_serials():
                # Revoked while this one was signed: it goes the same way.
                await context.revoke_cluster(self._cluster)
                raise ForbiddenError(REVOKED_SESSION)
        except (PkiError, StoreError, ForbiddenError) as exc:
            logger.warning("certificate renewal refused: %s", exc, extra={"cluster": self._cluster})
            self._send(kinds.MESSAGE_CERT_REFUSED, {"message": str(exc)[:200]})
            return
        self._renewed[self._cluster] = asyncio.get_running_loop().time()
        logger.info(
            "renewed the agent's certificate until %s",
            issued.not_after,
            extra={"cluster": self._cluster},
        )
        self._send(
            kinds.MESSAGE_CERT_ISSUED,
            {"certificate": issued.cert_pem.decode(), "ca": context.identity.ca.cert_pem.decode()},
        )

    def _check_spacing(self) -> None:
        """Refuse a renewal within a tenth of a lifetime of the cluster's last one.

        An agent renews at half its certificate's lifetime; one that asks
        again and again (272 certificates in 0.2 s, in review) only fills the
        store with certificates that must all be revoked if it is stolen.
        """
        last = self._renewed.get(self._cluster)
        if last is None:
            return
        spacing = self._context.settings.identity.client_cert_lifetime.total_seconds() / 10
        wait = last + spacing - asyncio.get_running_loop().time()
        if wait > 0:
            raise ForbiddenError(
                f"cluster {self._cluster}'s certificate was renewed less than {spacing:.0f}s "
                f"ago (a tenth of its lifetime); ask again in {wait:.0f}s"
            )

    def _send(self, kind: str, body: dict[str, Any]) -> None:
        if self.session is not None and self.session.is_open:
            self.session.send_message(kind, body)
