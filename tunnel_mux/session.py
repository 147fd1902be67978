"""A session: one protocol connection driven over one message transport.

Three tasks, all owned by :meth:`Session.run`: the reader feeds every
received message to the connection and hands events to streams without ever
waiting on one of them; the writer sends what the connection has to send, one
message at a time so that late control frames and other streams are not
queued behind bulk data; the timer keeps the connection alive. Handlers of
peer-opened streams run as tasks that the session also owns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from protocol import (
    Connection,
    DataReceived,
    ErrorCode,
    Event,
    GoAwayReceived,
    HandshakeCompleted,
    MessageReceived,
    PongReceived,
    RemoteProtocolError,
    StreamEnded,
    StreamOpened,
    StreamReset,
)
from protocol.errors import describe_code

from .errors import PeerProtocolError, SessionClosedError, SessionError, StreamResetError
from .stream import MuxStream
from .timer import SessionTimer
from .transport import MessageTransport, TransportClosed

__all__ = ["Session", "SessionHandlers"]

logger = logging.getLogger(__name__)

#: How long the writer may take to flush a last GOAWAY once the session ends.
FLUSH_GRACE = 2.0
#: Frames queued at which a task sends them itself (see Session.send_if_due).
BATCH_FRAMES = 24


@dataclass(frozen=True, slots=True)
class SessionHandlers:
    """What to do with what the peer starts.

    on_stream: runs once per peer-opened stream, as a task the session owns;
        when it returns, a stream it left open is ended (or reset on error).
        Without it, peer-opened streams are refused.
    on_message: called with each connection-level message; must not block.
    """

    on_stream: Callable[[MuxStream], Awaitable[None]] | None = None
    on_message: Callable[[str, dict[str, Any]], None] | None = None


class Session:
    """Drives one :class:`protocol.Connection` over one :class:`MessageTransport`."""

    def __init__(
        self,
        transport: MessageTransport,
        connection: Connection,
        *,
        handlers: SessionHandlers | None = None,
        clock: Callable[[], float] = time.monotonic,
        label: str = "",
        batch_frames: int = BATCH_FRAMES,
    ) -> None:
        if batch_frames < 1:
            raise ValueError("batch_frames must be at least 1")
        self.connection = connection
        self.label = label
        self.batch_frames = batch_frames
        self.handshake: HandshakeCompleted | None = None
        #: Why the session ended, once it has: the error its streams failed
        #: with (a SessionTimeoutError: the peer stopped answering).
        self.close_error: SessionError | None = None
        self._transport = transport
        self._handlers = handlers or SessionHandlers()
        self._clock = clock
        self._timer = SessionTimer(connection, clock, label)
        self._streams: dict[int, MuxStream] = {}
        self._blocked: set[MuxStream] = set()
        self._ending: set[MuxStream] = set()
        self._pings: dict[int, asyncio.Future[float]] = {}
        self._handler_tasks: set[asyncio.Task[None]] = set()
        self._handler_of: dict[int, asyncio.Task[None]] = {}
        # The writer's wake-up: a flag, and a future only while it sleeps (an
        # Event costs more, and _kick runs for every write and acknowledgement).
        self._kicked = True  # the HELLO is already queued
        self._writer_waiter: asyncio.Future[None] | None = None
        # One sender at a time: the writer sleeps while a task in send_if_due
        # sends, and send_if_due does nothing while the writer sends.
        self._sending_early = False
        self._writing = False
        #: The event loop the session runs on. Kept, because asking for the
        #: running loop costs a getpid() system call on CPython 3.11.
        self.loop = asyncio.get_running_loop()
        self._ready: asyncio.Future[HandshakeCompleted] = self.loop.create_future()
        self._closed = asyncio.Event()  # torn down: every task finished
        self._ended = asyncio.Event()  # over: no stream can be used any more
        self._idle = asyncio.Event()
        self._idle.set()
        #: For metrics: resets seen, by code, and time writers waited for credit.
        self.resets: Counter[int] = Counter()
        self.flow_wait_seconds = 0.0
        #: Messages a task sent itself (send_if_due), rather than the writer.
        self.batches_sent_early = 0

    def __repr__(self) -> str:
        return f"<Session {self.label} streams={len(self._streams)}>"

    # ------------------------------------------------------------------ public

    @property
    def close_reason(self) -> str | None:
        """Why the session ended, in words; None while it has not."""
        return None if self.close_error is None else str(self.close_error)

    @property
    def is_open(self) -> bool:
        """Handshake done and not ended: streams may be opened."""
        return self.handshake is not None and not self._ended.is_set()

    @property
    def streams(self) -> int:
        return len(self._streams)

    def silent_for(self) -> float | None:
        """Seconds since the peer was last heard from; None if it never was."""
        heard = self.connection.last_received
        return None if heard is None else max(0.0, self._clock() - heard)

    @property
    def transport(self) -> MessageTransport:
        """What the session's messages go over."""
        return self._transport

    @property
    def sending(self) -> bool:
        """A message is being written now (by the writer, or in :meth:`send_if_due`)."""
        return self._writing or self._sending_early

    def stream_kinds(self) -> Counter[str]:
        """Open streams by kind."""
        return Counter(stream.kind for stream in self._streams.values())

    async def wait_ready(self) -> HandshakeCompleted:
        """Wait for the handshake; raises SessionClosedError if the session ends first."""
        return await asyncio.shield(self._ready)

    async def wait_closed(self) -> None:
        """Wait until the session has ended (its socket may still be closing)."""
        await self._ended.wait()

    def open_stream(
        self, kind: str, headers: Mapping[str, Any] | None = None, *, end_stream: bool = False
    ) -> MuxStream:
        """Open a stream to the peer.

        Fails at once (never waits) when the session is closed, going away, or
        at the peer's stream limit: callers answer their own client promptly.
        """
        if self._ended.is_set():
            raise SessionClosedError(self.close_reason or "the session has ended")
        stream_id = self.connection.open_stream(kind, headers, end_stream=end_stream)
        stream = MuxStream(self, stream_id, kind, dict(headers or {}), local=True)
        if end_stream:
            stream._write_closed = True
        self._track(stream)
        self._timer.probe()
        self._kick()
        return stream

    async def send_if_due(self) -> None:
        """Send what is queued now if a batch of :attr:`batch_frames` has gathered.

        Frames queued during one turn of the event loop go out together when
        the writer runs, after the turn: one message, one TLS record. In a
        burst (64 requests read in one turn, say), the peer then starts on the
        first only once this side has handled the last. A task that has just
        queued frames calls this, so that the peer works on one batch while
        this side prepares the next (docs/benchmarks.md, "batches that overlap").
        Frames still go in batches, in the order they were queued; the writer
        does not send meanwhile. One message at most: what is left, and what
        other streams queue while it waits for the socket, is the writer's,
        so that a task never carries other streams' traffic for long.
        """
        if (
            self._sending_early
            or self._writing
            or self.connection.queued_frames < self.batch_frames
            or self.connection.closed
        ):
            return
        # Streams waiting for connection credit count as queued, but send nothing.
        messages = self.connection.data_to_send(max_messages=1)
        if not messages:
            return
        self.batches_sent_early += 1
        self._sending_early = True
        try:
            await self._send_message(messages[0])
        except Exception as exc:
            # The message taken may be lost: the connection cannot go on, as
            # when the writer fails (the caller sees the error too).
            logger.error("%s: sending failed", self.label, exc_info=exc)
            self._end(SessionClosedError(f"internal error: {exc!r}"))
            raise
        finally:
            self._sending_early = False
            self._wake_writer()  # it slept through any kick meanwhile

    def send_message(self, kind: str, body: Mapping[str, Any]) -> None:
        """Send a connection-level control message."""
        if self._ended.is_set():
            raise SessionClosedError(self.close_reason or "the session has ended")
        self.connection.send_message(kind, body)
        self._timer.probe()
        self._kick()

    async def ping(self) -> float:
        """Round-trip time of one PING, in seconds."""
        if self._ended.is_set():
            raise SessionClosedError(self.close_reason or "the session has ended")
        opaque = self.connection.send_ping(self._clock())
        future: asyncio.Future[float] = self.loop.create_future()
        self._pings[opaque] = future
        self._kick()
        try:
            return await future
        finally:
            self._pings.pop(opaque, None)

    async def shutdown(self, grace: float) -> None:
        """Graceful end: GOAWAY, let open streams finish for ``grace`` seconds, close."""
        if not self._ended.is_set():
            self.connection.goaway(ErrorCode.NO_ERROR, "shutting down")
            self._kick()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), grace)
        await self.close(ErrorCode.NO_ERROR, "shutting down")

    async def close(self, code: int = ErrorCode.NO_ERROR, reason: str = "") -> None:
        """End the session now; open streams fail with SessionClosedError."""
        if not self.connection.closed:
            self.connection.close(code, reason)
            self._end(SessionClosedError(reason or "the session was closed"))
        self._kick()
        await self._closed.wait()

    async def run(self) -> None:
        """Run the session until it ends. Every task it started is done on return."""
        loops = {
            asyncio.create_task(self._read_loop(), name=f"{self.label} reader"),
            asyncio.create_task(self._write_loop(), name=f"{self.label} writer"),
            asyncio.create_task(self._timer.run(self._kick, self._end), name=f"{self.label} timer"),
        }
        # The tear-down awaits, so it runs after the try statement rather than
        # in a finally block: mypyc, which compiles this module, would leave
        # the exception being raised as the thread's current one (setup.py).
        failure: BaseException | None = None
        try:
            await self._until_a_loop_ends(loops)
        except BaseException as exc:  # noqa: BLE001 - raised again after the tear-down
            failure = exc
        await self._tear_down(loops)
        if failure is not None:
            raise failure

    async def _until_a_loop_ends(self, loops: set[asyncio.Task[None]]) -> None:
        _, pending = await asyncio.wait(loops, return_when=asyncio.FIRST_COMPLETED)
        writer = next(t for t in loops if t.get_name().endswith("writer"))
        if writer in pending:
            # Let a last GOAWAY go out before the socket closes.
            self._kick()
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(writer), FLUSH_GRACE)

    async def _tear_down(self, loops: set[asyncio.Task[None]]) -> None:
        try:
            for task in loops:
                task.cancel()
            results = await asyncio.gather(*loops, return_exceptions=True)
            self._end(self._first_error(results))
            for handler in self._handler_tasks:
                handler.cancel()
            await asyncio.gather(*self._handler_tasks, return_exceptions=True)
            with contextlib.suppress(TransportClosed, OSError):
                await self._transport.close(self.close_reason or "")
        finally:
            # Also when cancelled midway (its socket's handler is, when the
            # connection drops while the close waits for the peer's reply):
            # close() and shutdown() wait for this, and would wait forever.
            # Nothing the session started outlives it, awaited or not.
            for task in (*loops, *self._handler_tasks):
                task.cancel()
            self._end(None)
            self._closed.set()

    # ------------------------------------------------------------------ loops

    async def _read_loop(self) -> None:
        connection = self.connection
        while not connection.closed:
            try:
                message = await self._transport.receive()
            except TransportClosed:
                self._end(SessionClosedError("the connection to the peer was lost"))
                return
            if self.connection.closed:  # type: ignore[unreachable, unused-ignore]
                return  # closed by this side while the message was on its way
            try:
                events = connection.receive_data(message, self._clock())
            except RemoteProtocolError as exc:
                logger.warning("%s: peer broke the protocol: %s", self.label, exc)
                self._end(PeerProtocolError(exc.code, f"protocol error: {exc}"))
                self._kick()
                return
            for event in events:
                self._dispatch(event)
            self._kick()

    async def _write_loop(self) -> None:
        connection = self.connection
        loop = self.loop
        while True:
            # Asleep until kicked, and while a task sends a message itself.
            while not self._kicked or self._sending_early:
                waiter = self._writer_waiter = loop.create_future()
                try:
                    await waiter
                finally:
                    self._writer_waiter = None
            # Kicks from here on, even while a message is being sent, make another pass.
            self._kicked = False
            self._writing = True
            try:
                sent = await self._send_queued()
            finally:
                self._writing = False
            if not sent or connection.closed:
                return

    async def _send_queued(self) -> bool:
        """Send every queued message; False once the transport is gone."""
        while messages := self.connection.data_to_send(max_messages=1):
            if not await self._send_message(messages[0]):
                return False
        self._after_send()
        return True

    async def _send_message(self, message: bytes) -> bool:
        """Send one message taken from the connection; False once the transport is gone."""
        try:
            await self._transport.send(message)
        except TransportClosed:
            self._end(SessionClosedError("the connection to the peer was lost"))
            return False
        self._after_send()
        return True

    # ------------------------------------------------------------- dispatching

    def _dispatch(self, event: Event) -> None:
        if type(event) is DataReceived:
            stream = self._streams.get(event.stream_id)
            if stream is not None:
                stream._feed(event.data)
        elif type(event) is StreamOpened:
            self._accept(event)
        elif type(event) is StreamEnded:
            stream = self._streams.get(event.stream_id)
            if stream is not None:
                stream._feed_eof()
                self._forget_if_done(stream)
        elif type(event) is StreamReset:
            self.resets[event.code] += 1
            stream = self._streams.pop(event.stream_id, None)
            if stream is not None:
                stream._fail(StreamResetError(event.code, event.reason, remote=event.remote))
                self._ending.discard(stream)
                self._check_idle()
            handler = self._handler_of.pop(event.stream_id, None)
            if handler is not None and event.remote:
                # The peer gave up on the stream: stop its handler now, even if
                # it waits on something else (e.g. an idle upstream watch).
                handler.cancel()
        elif type(event) is MessageReceived:
            if self._handlers.on_message is not None:
                self._handlers.on_message(event.kind, event.body)
        elif type(event) is PongReceived:
            future = self._pings.get(event.opaque)
            if future is not None and not future.done():
                future.set_result(event.rtt)
        elif type(event) is HandshakeCompleted:
            self.handshake = event
            if not self._ready.done():
                self._ready.set_result(event)
            # A first round trip while the connection is idle: the smallest
            # round trip sizes stream credit while streams share the connection
            # (docs/protocol.md, "Sharing the connection"). Its PONG needs no
            # waiter. Not if a GOAWAY in the HELLO's message already ended it.
            if not self.connection.closed:
                self.connection.send_ping(self._clock())
        elif type(event) is GoAwayReceived and event.code != ErrorCode.NO_ERROR:
            detail = f": {event.reason}" if event.reason else ""
            self._end(
                SessionClosedError(
                    f"the peer closed the connection ({describe_code(event.code)}){detail}"
                )
            )

    def _accept(self, event: StreamOpened) -> None:
        stream = MuxStream(self, event.stream_id, event.kind, event.headers, local=False)
        if self._handlers.on_stream is None:
            self.connection.reset_stream(event.stream_id, ErrorCode.REFUSED_STREAM, "no handler")
            return
        self._track(stream)
        task = self.loop.create_task(
            self._run_handler(self._handlers.on_stream, stream),
            name=f"{self.label} stream {stream.id}",
        )
        self._handler_tasks.add(task)
        self._handler_of[stream.id] = task
        task.add_done_callback(self._handler_tasks.discard)
        task.add_done_callback(lambda _: self._handler_of.pop(stream.id, None))

    async def _run_handler(
        self, handler: Callable[[MuxStream], Awaitable[None]], stream: MuxStream
    ) -> None:
        try:
            await handler(stream)
        except asyncio.CancelledError:
            stream.reset(ErrorCode.CANCEL, "cancelled")
            raise
        except SessionError as exc:
            logger.debug("%s: stream %d ended: %s", self.label, stream.id, exc)
            stream.reset(ErrorCode.CANCEL, "")
        except Exception:
            logger.exception("%s: handler of stream %d failed", self.label, stream.id)
            stream.reset(ErrorCode.INTERNAL_ERROR, "handler failed")
        else:
            stream.end()

    # ------------------------------------------------------- used by streams

    def _send_capacity(self, stream_id: int) -> int:
        if self.connection.closed:
            return 0
        return self.connection.send_capacity(stream_id)

    def _send_data(self, stream_id: int, data: memoryview) -> None:
        self.connection.send_data(stream_id, data)
        self._timer.probe()  # a keystroke into an exec session idle for an hour, say
        self._kick()

    def _wait_writable(self, stream: MuxStream) -> None:
        self._blocked.add(stream)

    def _end_stream(self, stream_id: int) -> None:
        stream = self._streams.get(stream_id)
        if stream is None or self.connection.stream_state(stream_id) is None:
            return
        self.connection.end_stream(stream_id)
        self._ending.add(stream)
        self._kick()

    def _reset_stream(self, stream_id: int, code: int, reason: str) -> None:
        self.resets[code] += 1
        stream = self._streams.pop(stream_id, None)
        if stream is not None:
            self._ending.discard(stream)
            self._blocked.discard(stream)
        if not self.connection.closed:
            self.connection.reset_stream(stream_id, code, reason)
            self._kick()
        self._check_idle()

    def _acknowledge(self, stream_id: int, size: int) -> None:
        if not self.connection.closed:
            self.connection.acknowledge_data(stream_id, size)
            self._kick()

    # --------------------------------------------------------------- helpers

    def _kick(self) -> None:
        self._kicked = True
        self._wake_writer()

    def _wake_writer(self) -> None:
        waiter = self._writer_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _track(self, stream: MuxStream) -> None:
        self._streams[stream.id] = stream
        self._idle.clear()

    def _after_send(self) -> None:
        connection = self.connection
        if self._blocked:
            for stream in list(self._blocked):
                if connection.send_capacity(stream.id) > 0 or stream.error is not None:
                    self._blocked.discard(stream)
                    stream._wake_writer()
        if self._ending:
            for stream in list(self._ending):
                self._forget_if_done(stream)

    def _forget_if_done(self, stream: MuxStream) -> None:
        if self.connection.stream_state(stream.id) is None:
            self._streams.pop(stream.id, None)
            self._ending.discard(stream)
            self._check_idle()

    def _check_idle(self) -> None:
        if not self._streams:
            self._idle.set()

    def _end(self, error: SessionError | None) -> None:
        """Fail everything waiting on the session (idempotent)."""
        if error is None:
            error = SessionClosedError("the session has ended")
        if self.close_error is None:
            self.close_error = error
        if not self.connection.closed:
            self.connection.close(ErrorCode.NO_ERROR, "")
        for stream in list(self._streams.values()):
            stream._fail(error)
        self._streams.clear()
        self._ending.clear()
        for stream in self._blocked:
            stream._wake_writer()
        self._blocked.clear()
        for future in self._pings.values():
            if not future.done():
                future.set_exception(error)
        if not self._ready.done():
            self._ready.set_exception(error)
            self._ready.exception()  # retrieved: nobody may be waiting
        self._idle.set()
        self._ended.set()

    @staticmethod
    def _first_error(results: list[BaseException | None]) -> SessionError | None:
        for result in results:
            if isinstance(result, SessionError):
                return result
            if isinstance(result, TransportClosed):
                return SessionClosedError("the connection to the peer was lost")
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                logger.error("session task failed", exc_info=result)
                return SessionClosedError(f"internal error: {result!r}")
        return None
