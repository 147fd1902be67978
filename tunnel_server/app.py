"""The aiohttp application: one TLS port for agents, bootstrap, API and kubectl."""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import functools
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from tunnel_cli import freeze_startup_objects, request_path_build
from tunnel_pki.tls import server_context
from tunnel_server.access.cache import AccessCache
from tunnel_server.agents.bootstrap import BOOTSTRAP_PATH, bootstrap
from tunnel_server.agents.endpoint import setup_agent_socket
from tunnel_server.agents.registry import AgentRegistry
from tunnel_server.api.clusters import setup_api
from tunnel_server.api.users import setup_user_api
from tunnel_server.audit import AuditWriter
from tunnel_server.clock import utcnow
from tunnel_server.commands import CommandDispatcher, setup_command_api
from tunnel_server.config import ServerSettings
from tunnel_server.console import setup_console
from tunnel_server.console.sessions import COOKIE as CONSOLE_COOKIE
from tunnel_server.context import CONTEXT, ServerContext
from tunnel_server.edge.fdlimit import raise_file_limit
from tunnel_server.edge.frontdoor import LINGER_SECONDS, FrontDoor, FrontDoors
from tunnel_server.edge.listener import BoundedTlsListener
from tunnel_server.edge.parse_errors import ParseErrorLogger
from tunnel_server.errors import (
    ApiError,
    ConfigError,
    ConflictError,
    NotFoundApiError,
    TooManyRequestsError,
    UnavailableError,
)
from tunnel_server.metrics import ServerMetrics
from tunnel_server.proxy.identity import access_refusal
from tunnel_server.proxy.kubeproxy import setup_kube_proxy
from tunnel_server.proxy.live_requests import LiveRequests
from tunnel_server.replicas.changes import ChangeFollower
from tunnel_server.replicas.membership import Membership
from tunnel_server.replicas.peers import RunningReplica
from tunnel_server.retention import Pruner
from tunnel_server.statedir import ServerIdentity, StateLock, ensure_admin, prepare_state_dir
from tunnel_server.store.base import (
    AlreadyExistsError,
    NotFoundError,
    QueueFullError,
    Store,
    StoreError,
)
from tunnel_server.store.replicas import ReplicaStore
from tunnel_server.store.sqlite import SqliteStore

__all__ = [
    "create_app",
    "open_store",
    "run_server",
    "set_tls_read_buffer",
    "start_server",
    "stop_server",
]

logger = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
LISTENER: web.AppKey[BoundedTlsListener] = web.AppKey("listener", BoundedTlsListener)
FRONT_DOORS: web.AppKey[FrontDoors] = web.AppKey("front_doors", FrontDoors)
STATE_LOCK: web.AppKey[StateLock] = web.AppKey("state_lock", StateLock)
REPLICA: web.AppKey[RunningReplica] = web.AppKey("replica", RunningReplica)


def create_app(settings: ServerSettings, identity: ServerIdentity) -> web.Application:
    """The server's application; its store opens and closes with it."""
    app = web.Application(middlewares=[_errors], client_max_size=1024 * 1024)
    app.cleanup_ctx.append(_lifecycle(settings, identity))
    app.on_response_prepare.append(_say_close)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/metrics", _metrics)
    app.router.add_post(BOOTSTRAP_PATH, bootstrap)
    setup_agent_socket(app)
    setup_api(app)
    setup_user_api(app)
    setup_kube_proxy(app)
    setup_command_api(app)
    setup_console(app)
    return app


def _lifecycle(
    settings: ServerSettings, identity: ServerIdentity
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        store = await open_store(settings)
        try:
            await ensure_admin(store, settings.state_dir, utcnow())
            audit = AuditWriter(store)
            pruner = Pruner(
                store,
                audit_retention=settings.audit_retention,
                command_retention=settings.command_retention,
            )
            registry = AgentRegistry(settings.tunnel.replace_grace)
            membership = Membership(
                settings.replica,
                store if isinstance(store, ReplicaStore) else None,
                registry,
            )
            metrics = ServerMetrics()
            access = AccessCache(store)
            commands = CommandDispatcher(
                store, registry, audit, settings.commands, metrics, access=access
            )
            live = LiveRequests(
                access,
                functools.partial(access_refusal, access),
                on_ended=metrics.proxy_revoked.inc,
            )
            context = ServerContext(
                settings=settings,
                identity=identity,
                store=store,
                registry=registry,
                access=access,
                live=live,
                audit=audit,
                commands=commands,
                metrics=metrics,
                replicas=membership,
                revoked=await store.revoked_serials(),
            )
            app[CONTEXT] = context
            if membership.shared:

                async def held_elsewhere(cluster: str) -> bool:
                    return await membership.owner(cluster) is not None

                commands.held_elsewhere = held_elsewhere
            changes = ChangeFollower(
                store, membership, registry, access, live, commands, context.revoked
            )
            async with (
                audit.running(),
                commands.running(),
                live.running(),
                pruner.running(),
                changes.running(),
            ):
                yield
                await context.registry.close(grace=0)
        finally:
            await store.close()

    return lifecycle


async def open_store(settings: ServerSettings) -> Store:
    """The store ``settings`` name: PostgreSQL at ``store.database``, else SQLite in the
    state directory (the URL's password is never logged: ``PostgresStore.where``)."""
    if settings.store.database is None:
        return await SqliteStore.open(settings.state_dir / "state.db")
    # Imported only here: a server on SQLite never loads asyncpg.
    from tunnel_server.store.postgres import PostgresStore

    return await PostgresStore.open(
        settings.store.database,
        max_connections=settings.store.max_connections,
        statement_timeout=settings.store.statement_timeout,
    )


async def _say_close(request: web.Request, response: web.StreamResponse) -> None:
    """A connection the front door handed to aiohttp serves one request, then closes,
    unless an API client with a token is using it.

    What comes here is seldom repeated on a connection (tunnelctl's REST
    calls, a bootstrap, a probe, an upgrade, a request with a chunked body),
    and a connection kept alive here could not be closed to make room for
    another caller (tunnel_server/edge/callerlimit.py): one request at a time from
    a flood of connections would otherwise hold them all. The exception is a
    program driving the REST API (submitting commands, say): a handshake per
    request halved its rate (docs/benchmarks.md, "Command dispatch"). Its
    connection stays open while it is authenticated and busy, and closes after
    :data:`API_KEEPALIVE` idle seconds. Set as each response's head is
    prepared, errors and streamed answers included, so the head says
    ``Connection: close`` (a 101 keeps its ``Connection: upgrade``).
    """
    if _an_api_clients(request, response):
        return
    response.force_close()
    response.headers.setdefault("Connection", "close")


def _an_api_clients(request: web.Request, response: web.StreamResponse) -> bool:
    """Whether the connection is an API client's, with a token that was not refused, or a
    signed-in browser's on the console (a page loads its assets on the same connection)."""
    if not request.keep_alive or response.status == 401:
        return False
    if request.path.startswith("/api/"):
        return "Authorization" in request.headers
    return request.path.startswith("/ui/") and CONSOLE_COOKIE in request.cookies


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return _error_response(exc)
    except NotFoundError as exc:
        return _error_response(NotFoundApiError(str(exc)))
    except AlreadyExistsError as exc:
        return _error_response(ConflictError(str(exc), code="already_exists"))
    except QueueFullError as exc:
        return _error_response(TooManyRequestsError(str(exc), code="queue_full"))
    except StoreError as exc:
        logger.error("store failure: %s", exc)
        return _error_response(UnavailableError("the server's store is unavailable"))


def _error_response(error: ApiError) -> web.Response:
    status = error.status
    response = web.json_response(
        {"error": {"status": status, "code": error.code, "message": error.message}},
        status=status,
    )
    if error.retry_after is not None:
        response.headers["Retry-After"] = str(max(1, round(error.retry_after)))
    return response


#: Seconds an API client's connection stays open without a request (see _say_close).
API_KEEPALIVE = 5.0


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _metrics(request: web.Request) -> web.Response:
    context = request.app[CONTEXT]
    context.metrics.clusters_connected.set(len(context.registry.connected()))
    context.metrics.proxy_in_progress.set(len(context.live))
    context.metrics.store_write_failing.set(context.store.write_failure is not None)
    return web.Response(
        body=context.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )


async def _readyz(request: web.Request) -> web.Response:
    """Ready while the store answers and can write: a server that cannot record its audit
    trail, commands or agents' connections takes no new callers (docs/operations.md)."""
    context = request.app[CONTEXT]
    try:
        await context.store.health()
    except StoreError as exc:
        raise UnavailableError(f"not ready: {exc}") from exc
    if context.replicas.lease_lost is not None:
        raise UnavailableError(f"not ready: {context.replicas.lease_lost}")
    if context.replicas.draining:
        raise UnavailableError("not ready: this replica is stopping")
    return web.json_response({"status": "ready"})


def set_tls_read_buffer(size: int) -> bool:
    """Make asyncio's TLS connections read ``size`` bytes at once (process-wide).

    CPython keeps this in a class attribute of its TLS protocol, allocated per
    connection; it has no public setting. Returns False (and changes nothing)
    where the attribute is missing.
    """
    protocol = getattr(asyncio.sslproto, "SSLProtocol", None)
    if protocol is None or not isinstance(getattr(protocol, "max_size", None), int):
        logger.warning("cannot set the TLS read buffer on this Python; using its default")
        return False
    protocol.max_size = size
    return True


async def start_server(settings: ServerSettings) -> tuple[web.AppRunner, int]:
    """Start listening; return the runner and the bound port (for port 0)."""
    set_tls_read_buffer(settings.tunnel.tls_read_buffer)
    lock = StateLock(settings.state_dir)
    try:
        return await _start_locked(settings, lock)
    except BaseException:
        lock.release()
        raise


async def _start_locked(settings: ServerSettings, lock: StateLock) -> tuple[web.AppRunner, int]:
    identity = prepare_state_dir(settings, utcnow())
    ssl_context = server_context(identity.tls_cert_pem, identity.tls_key_pem, identity.ca.cert_pem)
    app = create_app(settings, identity)
    runner = web.AppRunner(
        app,
        handle_signals=False,
        access_log=None,
        shutdown_timeout=settings.tunnel.shutdown_grace,
        # A caller that goes away cancels its handler at once, so a relayed
        # watch is closed upstream instead of waiting for its next event.
        handler_cancellation=True,
        # Only an API client's connection is kept here between requests
        # (_say_close), and it cannot be closed to make room: briefly. An
        # unread body is waited for LINGER_SECONDS after an answer.
        keepalive_timeout=API_KEEPALIVE,
        lingering_time=LINGER_SECONDS,
        # A body is relayed as it came: decoded here, it would reach the API
        # server still labelled with its Content-Encoding.
        auto_decompress=False,
        # A request aiohttp cannot parse is one INFO line, as the front door's are.
        logger=ParseErrorLogger(logging.getLogger("aiohttp.server")),
    )

    def aiohttp_connection() -> asyncio.Protocol:
        assert runner.server is not None
        return runner.server()

    doors = FrontDoors(
        max_callers=settings.tunnel.max_caller_connections,
        per_address=settings.tunnel.max_caller_connections_per_address,
    )

    def connection() -> asyncio.Protocol:
        return FrontDoor(app, aiohttp_connection, doors)

    listener = BoundedTlsListener(
        connection,
        settings.listen.host,
        settings.listen.port,
        ssl_context,
        limit=settings.tunnel.max_tls_handshakes,
        handshake_timeout=settings.tunnel.tls_handshake_timeout,
        held=settings.tunnel.max_tls_held,
        grace=settings.tunnel.tls_handshake_grace,
    )
    app[LISTENER] = listener  # before setup: a started app's state is frozen
    app[FRONT_DOORS] = doors
    app[STATE_LOCK] = lock
    app[REPLICA] = RunningReplica()
    await runner.setup()
    app[CONTEXT].metrics.watch_callers(doors.callers)  # made by the set-up
    app[CONTEXT].metrics.watch_handshakes(listener.admission)
    listener.observe_handshake = app[CONTEXT].metrics.tls_handshake_seconds.observe
    try:
        port = await listener.start()
    except OSError as exc:
        await runner.cleanup()
        raise ConfigError(
            f"cannot listen on {settings.listen.host}:{settings.listen.port}: {exc.strerror}"
        ) from exc
    context = app[CONTEXT]
    if context.replicas.shared:
        try:
            context.links = await app[REPLICA].start(
                settings.replica,
                settings.tunnel,
                identity.ca,
                context.registry,
                context.replicas,
            )
        except BaseException:
            await listener.stop()
            await runner.cleanup()
            raise
    logger.info(
        "listening on %s:%d (public URL %s); request path %s",
        settings.listen.host,
        port,
        settings.listen.public_url,
        request_path_build(),
    )
    return runner, port


async def stop_server(runner: web.AppRunner) -> None:
    """Shut down gracefully: GOAWAY to every agent, let open streams finish
    (up to the shutdown grace), then close everything.

    The agents' sessions are drained before aiohttp's own shutdown, which
    closes every connection, WebSockets included, and would cut them short.
    """
    context = runner.app[CONTEXT]
    await context.replicas.drain()  # the others stop forwarding here
    await runner.app[LISTENER].stop()  # no new connections meanwhile
    await context.registry.close(context.settings.tunnel.shutdown_grace)
    await runner.app[REPLICA].stop()  # releases its sessions: their agents are elsewhere
    await runner.app[FRONT_DOORS].close()
    await runner.cleanup()
    runner.app[STATE_LOCK].release()


async def run_server(settings: ServerSettings) -> None:
    """Serve until SIGINT or SIGTERM, then shut down gracefully."""
    tunnel = settings.tunnel
    raise_file_limit(tunnel.max_caller_connections + tunnel.max_tls_held)
    runner, _ = await start_server(settings)
    freeze_startup_objects()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
        logger.info("shutting down: GOAWAY to every agent")
    finally:
        await stop_server(runner)
