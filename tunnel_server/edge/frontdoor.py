"""The lean front end: plain kubectl requests served without aiohttp.

Every caller connection starts here. Requests to ``/k8s/clusters/{cluster}/...``
that are plain HTTP/1.1 (no upgrade, no chunked request body, no ``Expect``)
are parsed and relayed by this protocol: one task per request, the head
parsed in place, the body streamed both ways with back-pressure on each side
(the caller's socket pauses the agent's stream through its credit; a full
stream pauses the caller's socket). Anything else, at a request boundary,
is handed to aiohttp with the bytes read so far, and the connection is
aiohttp's from then on, for that one request (app.py closes it after): the
agent socket, the REST API, upgrades (exec, attach, port-forward).

Why: aiohttp's server costs more per request than the rest of the tunnel (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from typing import cast

from aiohttp import web

from protocol.http import METHODS, ResponseHead
from tunnel_kube.tcp_keepalive import enable_tcp_keepalive
from tunnel_mux import MuxStream, SessionError
from tunnel_server.context import CONTEXT
from tunnel_server.edge.buffers import AnswerOutput, RequestBody
from tunnel_server.edge.callerlimit import CountedProtocol, FrontDoors, peer_certificate_serial
from tunnel_server.edge.handshakes import source_of
from tunnel_server.edge.http1 import (
    LAST_CHUNK,
    MAX_HEAD,
    CallerRequest,
    HeaderBlockCache,
    MalformedRequestError,
    chunk,
    parse_request_head,
    response_head,
)
from tunnel_server.proxy.answer import AnswerFraming, answer_framing
from tunnel_server.proxy.exchange import ProxyExchange
from tunnel_server.proxy.refusal import ProxyRefusal, revocation_event
from tunnel_server.proxy.request import CallerMemo, ProxiedRequest, cluster_of

__all__ = ["KEEPALIVE_TIMEOUT", "FrontDoor", "FrontDoors"]

logger = logging.getLogger(__name__)

#: An idle caller connection (or one slow to send its head) is closed after this.
KEEPALIVE_TIMEOUT = 75.0
#: After an answer that came before its request's body, how long the rest of
#: the body is read and dropped before the connection closes (closing with
#: unread bytes makes the kernel send a reset that can destroy the answer).
LINGER_SECONDS = 5.0
#: Bytes of an answer gathered before they are written to the caller's socket.
OUTPUT_FLUSH = 64 * 1024
#: How early a timer may fire and still count as on time: uvloop's timers keep whole
#: milliseconds, so one may fire up to 1 ms early (and, set again, fire again at once).
TIMER_SLACK = 0.002


class FrontDoor(asyncio.Protocol):
    """One caller connection, until it is handed to aiohttp (if ever)."""

    def __init__(
        self,
        app: web.Application,
        aiohttp_protocol: Callable[[], asyncio.Protocol],
        doors: FrontDoors,
        *,
        keepalive_timeout: float = KEEPALIVE_TIMEOUT,
    ) -> None:
        self._app = app
        self._aiohttp_protocol = aiohttp_protocol
        self._doors = doors
        self._callers = doors.callers
        #: A caller's connection (no agent certificate, or a revoked one): it
        #: counts against the bound, and may be closed to make room while idle.
        self._counted = False
        #: Over the bound with nothing idle to close: its request gets a 503.
        self._refused = False
        #: The caller's address, as the bounds count it (handshakes.source_of).
        self._source = ""
        #: The serial of its agent certificate (not counted while not revoked), or None.
        self._agent_serial: int | None = None
        self._keepalive_timeout = keepalive_timeout
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        #: How much of the buffer is known to hold no complete head.
        self._scanned = 0
        self._header_cache = HeaderBlockCache()
        self._memo = CallerMemo()
        self._task: asyncio.Task[None] | None = None
        self._body: RequestBody | None = None
        self._reading_paused = False
        self._writing_paused = False
        self._drain_waiter: asyncio.Future[None] | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        #: When an idle connection is closed; None while a request is served.
        self._idle_deadline: float | None = None
        self._keep_alive = True
        self._lost = False
        #: Aborted by the server (at shutdown), not left by the caller.
        self._aborted = False

    # ------------------------------------------------------------ asyncio

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A cast: uvloop's transports do not subclass asyncio.Transport.
        self._transport = cast(asyncio.Transport, transport)
        enable_tcp_keepalive(transport)
        self._doors.open.add(self)
        peer = transport.get_extra_info("peername")
        self._source = source_of(peer[0]) if peer else ""
        serial = peer_certificate_serial(transport)
        if (
            serial is not None
            and serial not in self._app[CONTEXT].revoked
            and self._doors.agents.admit(serial)
        ):
            self._agent_serial = serial  # an agent's: not counted as a caller's
        else:
            self._count()
        self._arm_idle_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._doors.open.discard(self)
        self._cancel_idle_timer()
        if self._counted:
            self._counted = False
            self._callers.release(self._source)
        self._release_agent()
        if self._body is not None:
            self._body.fail()
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_exception(ConnectionResetError("the caller went away"))
        if self._task is not None:
            # The caller left: end the relayed request too (a watch upstream
            # closes now, not at its next event).
            self._task.cancel()

    def data_received(self, data: bytes) -> None:
        if self._body is not None and not self._body.complete:
            data = self._body.feed(data)
            if not data:
                return
        self._buffer += data
        if self._task is None and not self._writing_paused:
            self._next_request()
        elif len(self._buffer) > MAX_HEAD:
            self._pause_reading()  # pipelined requests wait their turn, bounded

    def eof_received(self) -> bool | None:
        assert self._transport is not None
        if self._task is None or self._transport.get_extra_info("sslcontext") is not None:
            return None  # nothing in progress, or TLS (no half-close): let it close
        self._keep_alive = False
        return True  # a request in progress still gets its answer, then the close

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)
        elif self._task is None and self._body is None and not self._lost:
            self._go_on()  # between requests: the next one waited for the caller to read

    # ------------------------------------------------------------- public

    def close(self) -> asyncio.Task[None] | None:
        """Close the connection; returns the request task still ending, if any."""
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()
        return self._task

    @property
    def busy(self) -> bool:
        """A request is in progress on the connection."""
        return self._task is not None

    def _count(self) -> None:
        self._counted = True
        self._refused = not self._callers.admit(self._source)

    def evict(self) -> None:
        """Close this idle connection to make room for another (it is no longer counted)."""
        self._counted = False
        self.close()

    def abort(self) -> asyncio.Task[None] | None:
        """Close at once, dropping unsent data; returns the request task still ending."""
        self._aborted = True
        if self._transport is not None:
            self._transport.abort()
        return self._task

    # ----------------------------------------------------------- requests

    def _next_request(self) -> None:
        assert self._transport is not None
        if self._lost or self._transport.is_closing():
            return
        while self._buffer.startswith(b"\r\n"):  # empty lines before it (RFC 9112, 2.2)
            del self._buffer[:2]
            self._scanned = 0
        # Search only what came since the last look (not all again per byte sent).
        end = self._buffer.find(b"\r\n\r\n", max(0, self._scanned - 3))
        if end < 0:
            self._scanned = len(self._buffer)
            if len(self._buffer) > MAX_HEAD:
                self._answer_bad_request(
                    MalformedRequestError("the request head is too large", status=431)
                )
            return
        try:
            request = parse_request_head(bytes(self._buffer[:end]), self._header_cache)
        except MalformedRequestError as exc:
            self._answer_bad_request(exc)
            return
        serial = self._agent_serial
        if serial is not None and serial in self._app[CONTEXT].revoked:
            self._release_agent()  # revoked since it came: a caller's from now on
            self._count()
        if self._refused:
            refusal = self._callers.refusal(self._source)
            if refusal is not None:
                self._answer_over_limit(request, refusal)
                return
            self._refused = False  # room was made since it came
        cluster = cluster_of(request.target)
        if (
            cluster is None
            or request.upgrade is not None
            or request.chunked
            or request.expect
            or request.minor_version != 1
            or request.method not in METHODS
        ):
            self._hand_over()
            return
        self._idle_deadline = None  # the timer runs between requests only
        if self._counted:
            self._callers.busy(self)
        del self._buffer[: end + 4]  # moves the bytearray's start: the rest is not copied
        self._scanned = 0
        body: RequestBody | None = None
        if request.content_length:
            body = self._body = RequestBody(
                request.content_length, self._pause_reading, self._resume_reading
            )
            if self._buffer:
                taken = bytes(self._buffer[: request.content_length])
                del self._buffer[: len(taken)]
                body.feed(taken)
            if body.wants_more:  # reading may be paused: the pipeline was over its bound
                self._resume_reading()
        self._keep_alive = request.keep_alive
        self._task = self._loop.create_task(self._serve(request, cluster, body))
        self._task.add_done_callback(self._request_done)

    def _request_done(self, task: asyncio.Task[None]) -> None:
        self._task = None
        if not task.cancelled() and task.exception() is not None:
            logger.error("proxied request failed", exc_info=task.exception())
            self._keep_alive = False
        if self._lost or self._transport is None:
            return
        body = self._body
        if body is not None and not body.complete:
            # Answered before its body came: read the rest and drop it, then close.
            self._keep_alive = False
            body.discard(on_complete=self.close)
            self._resume_reading()
            self._cancel_idle_timer()
            self._idle_timer = self._loop.call_later(LINGER_SECONDS, self.close)
            return
        self._body = None
        if not self._keep_alive:
            self.close()
            return
        self._arm_idle_timer()
        if not self._writing_paused:  # else resume_writing goes on, once the caller reads
            self._go_on()

    def _go_on(self) -> None:
        """Between requests: read on, and start the next request if it came."""
        if self._transport is None or self._transport.is_closing():
            return
        # Past MAX_HEAD of pipelined requests held, an answer lets no more in.
        if len(self._buffer) <= MAX_HEAD:
            self._resume_reading()
        if self._buffer:
            self._next_request()

    async def _serve(self, request: CallerRequest, cluster: str, body: RequestBody | None) -> None:
        proxied = ProxiedRequest(self._app[CONTEXT], cluster, request.method)
        # The clean-up awaits, so it runs after the try statement rather than
        # in a finally block: mypyc, which compiles this module, would leave
        # the exception being raised as the thread's current one (setup.py).
        failure: BaseException | None = None
        try:
            await self._answer(request, body, proxied)
        except BaseException as exc:  # noqa: BLE001 - raised again after the clean-up
            failure = exc
            exchange = proxied.exchange
            if isinstance(exc, asyncio.CancelledError) and not exchange.ended:
                # Only connection_lost cancels a request: the caller left, or the server aborted.
                exchange.cut_short("the server shut down" if self._aborted else "the caller left")
        # Before any await: a cancellation there must not leave the request held as live.
        proxied.release()
        await proxied.close()
        if failure is not None:
            raise failure

    async def _answer(
        self, request: CallerRequest, body: RequestBody | None, proxied: ProxiedRequest
    ) -> None:
        """Relay the request and its answer; refusals and failures are answered here."""
        exchange = proxied.exchange
        cluster = exchange.cluster
        head_sent = False
        try:
            stream = await proxied.open(
                request.target,
                request.headers,
                upgrade=None,
                has_body=body is not None,
                # Only a block the connection remembers can repeat: a larger one is
                # parsed anew each time and would only be held here for nothing.
                memo=self._memo if self._header_cache.holds(request.headers) else None,
            )
            if body is not None:
                proxied.upload(body.read)
            response, early = await proxied.response_head()
            framing = answer_framing(request.method, response, cluster)
            head_sent = True
            await self._relay_response(response, framing, early, stream, exchange)
        except ProxyRefusal as refusal:
            exchange.refused(refusal)
            if not head_sent:
                self._answer_status(refusal, request)
        except ConnectionError:
            # The caller went away mid-response: the relayed request ends too.
            logger.info("the caller left mid-response", extra={"cluster": cluster})
            exchange.cut_short("the caller left")
        except Exception:
            logger.exception("proxied request failed", extra={"cluster": cluster})
            exchange.status = 500
            exchange.ended = "the tunnel server failed"
            self._keep_alive = False
            if not head_sent:
                self._answer_status(
                    ProxyRefusal(500, "InternalError", "the tunnel server failed; see its log"),
                    request,
                )

    async def _relay_response(
        self,
        response: ResponseHead,
        framing: AnswerFraming,
        early: bytes,
        stream: MuxStream,
        exchange: ProxyExchange,
    ) -> None:
        headers = framing.headers
        if self._body is not None and not self._body.complete:
            self._keep_alive = False  # answered before the body came: see _request_done
        if not self._keep_alive:
            headers.append(("connection", "close"))
        # What is ready goes out in one write (one TLS record, one system call
        # for a small answer: head, body and last chunk); it is flushed before
        # waiting for the agent and whenever 64 KiB are pending.
        out = AnswerOutput(self._write, self._writelines)
        out.add(response_head(response.status, framing.reason, headers))
        remaining = framing.length
        chunked = remaining is None
        between_events = True  # for a watch: the caller has whole events only
        try:
            data = early
            while True:
                if data:
                    between_events = data.endswith(b"\n")
                    exchange.bytes_out += len(data)
                    if remaining is None:
                        out.add(chunk(data))
                    else:
                        if len(data) > remaining:
                            raise SessionError("the agent sent more than its Content-Length")
                        remaining -= len(data)
                        out.add(data)
                if not stream.read_ready or out.size >= OUTPUT_FLUSH:
                    out.flush()
                    if self._writing_paused:
                        await self._drain()
                data = await stream.read()
                if not data:
                    break
        except SessionError as exc:
            exchange.cut_short(exc)
            event = revocation_event(exc, exchange.verb, response.headers, between_events)
            if event is not None and chunked:
                # Access revoked: the watch ends as the API server ends one, saying why.
                out.add(chunk(event))
                out.add(LAST_CHUNK)
                out.flush()
                return
            # The agent went away mid-response: end the caller's connection
            # without the last chunk, so the client sees the break (kubectl
            # get -w exits with an error; informers list and watch again).
            logger.info("response cut short: %s", exc, extra={"cluster": exchange.cluster})
            out.flush()
            self._abort()
            return
        if remaining:
            logger.info("the agent's answer ended short of its Content-Length")
            exchange.cut_short("the agent's answer ended short of its Content-Length")
            out.flush()
            self._abort()
            return
        if chunked:
            out.add(LAST_CHUNK)
        out.flush()

    # ------------------------------------------------------------ helpers

    def _write(self, data: bytes) -> None:
        assert self._transport is not None
        if self._lost:
            raise ConnectionResetError("the caller went away")
        self._transport.write(data)

    def _writelines(self, parts: list[bytes]) -> None:
        assert self._transport is not None
        if self._lost:
            raise ConnectionResetError("the caller went away")
        self._transport.writelines(parts)

    async def _drain(self) -> None:
        if self._lost:
            raise ConnectionResetError("the caller went away")
        waiter = self._drain_waiter = self._loop.create_future()
        try:
            await waiter
        finally:
            self._drain_waiter = None

    def _abort(self) -> None:
        self._keep_alive = False
        if self._transport is not None:
            self._transport.close()

    def _answer_status(self, refusal: ProxyRefusal, request: CallerRequest) -> None:
        if self._body is not None and not self._body.complete:
            self._keep_alive = False  # the rest of the body is still on its way
        body, headers = refusal.answer(request.header("accept") or "", request.target)
        if not self._keep_alive:
            headers.append(("connection", "close"))
        if request.method == "HEAD":
            body = b""  # the head a GET would get, without its body (RFC 9110, 9.3.2)
        with contextlib.suppress(ConnectionError):
            self._write(response_head(refusal.code, "", headers) + body)

    def _answer_bad_request(self, error: MalformedRequestError) -> None:
        """A malformed head: answer, and close (the byte stream cannot be trusted)."""
        assert self._transport is not None
        body = f"{error.message}\n".encode()
        headers = [
            ("content-type", "text/plain; charset=utf-8"),
            ("content-length", str(len(body))),
            ("connection", "close"),
        ]
        self._transport.write(response_head(error.status, "", headers) + body)
        self._buffer = bytearray()
        self.close()

    def _answer_over_limit(self, request: CallerRequest, refusal: str) -> None:
        self._keep_alive = False
        self._answer_status(ProxyRefusal(503, "ServiceUnavailable", refusal), request)
        self._buffer = bytearray()
        self.close()

    def _hand_over(self) -> None:
        """Give the connection, and what was read of it, to aiohttp."""
        transport = self._transport
        assert transport is not None
        self._cancel_idle_timer()
        self._doors.open.discard(self)
        protocol = self._aiohttp_protocol()
        if self._counted:
            # Still a caller's connection: counted until it closes.
            self._counted = False
            protocol = CountedProtocol(
                protocol, functools.partial(self._callers.release, self._source)
            )
        serial = self._agent_serial
        if serial is not None:
            # An agent's (its WebSocket): counted for its certificate until it closes.
            self._agent_serial = None
            protocol = CountedProtocol(
                protocol, functools.partial(self._doors.agents.release, serial)
            )
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        # Writes are flowing: no request starts while they are paused.
        if self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()
        data, self._buffer = bytes(self._buffer), bytearray()
        protocol.data_received(data)

    def _release_agent(self) -> None:
        serial, self._agent_serial = self._agent_serial, None
        if serial is not None:
            self._doors.agents.release(serial)

    def _pause_reading(self) -> None:
        if not self._reading_paused and self._transport is not None:
            self._reading_paused = True
            self._transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._reading_paused and self._transport is not None:
            self._reading_paused = False
            self._transport.resume_reading()

    def _arm_idle_timer(self) -> None:
        # One timer per connection, not one per request: a timer that fires
        # early (the connection was busy, or idle for less) sets itself again.
        if self._counted:
            self._callers.idle(self, self._source)
        self._idle_deadline = self._loop.time() + self._keepalive_timeout
        if self._idle_timer is None:
            self._idle_timer = self._loop.call_at(self._idle_deadline, self._idle_timeout)

    def _idle_timeout(self) -> None:
        self._idle_timer = None
        deadline = self._idle_deadline
        if deadline is None:
            return  # serving a request: armed again when it ends
        if deadline - self._loop.time() > TIMER_SLACK:
            self._idle_timer = self._loop.call_at(deadline, self._idle_timeout)
            return
        self.close()

    def _cancel_idle_timer(self) -> None:
        self._callers.busy(self)
        self._idle_deadline = None
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
