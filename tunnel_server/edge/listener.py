"""The server's TLS listener: handshakes bounded, and no address can hold them all.

asyncio's own server accepts every connection at once and advances all their
TLS handshakes together; when thousands of agents reconnect after a restart,
none finishes for seconds and then hundreds do at once (docs/benchmarks.md,
"Idle agents"). This listener runs at most ``limit`` handshakes at once.
Which connections take those slots, and which are let go, is
:mod:`tunnel_server.edge.handshakes`' policy; this module does the I/O: it accepts
every connection, has the kernel wake it when the connection's ClientHello
is whole (:mod:`tunnel_server.edge.clienthello`), starts and abandons handshakes
as the policy says, and closes a connection whose handshake is not done by
its deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import socket
import ssl
from collections.abc import Callable
from typing import Any

from tunnel_server.edge.clienthello import MAX_RECORD, RECORD_HEADER, client_hello_needs
from tunnel_server.edge.handshakes import (
    DEFAULT_GRACE,
    DEFAULT_HANDSHAKES,
    DEFAULT_HELD,
    DEFAULT_TIMEOUT,
    HandshakeAdmission,
)

__all__ = ["BoundedTlsListener"]

logger = logging.getLogger(__name__)

#: Bytes looked at on a connection's first wake: one whole record, commonly
#: the whole ClientHello.
_FIRST_LOOK = RECORD_HEADER + MAX_RECORD
#: The least of its deadline a connection keeps for its handshake itself: one
#: still waiting for its ClientHello or a slot this close to it is closed.
_LEAST_HANDSHAKE_TIME = 1.0
#: Accepts in a row before the accept loop lets the others run (asyncio's
#: loop returns an accept that is ready without a turn of the loop).
_ACCEPTS_PER_TURN = 64
#: Seconds between two warnings that connections cannot be accepted.
_ACCEPT_WARNING_INTERVAL = 60.0


class _Pending:
    """An accepted connection, from its accept until its handshake ends."""

    __slots__ = ("deadline", "done", "expiry", "made", "needed", "sock", "started", "task")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        #: When its handshake must be done (the loop's clock).
        self.deadline = deadline
        self.expiry: asyncio.TimerHandle | None = None
        #: Bytes of the ClientHello the kernel is to wait for.
        self.needed = RECORD_HEADER
        self.task: asyncio.Task[object] | None = None
        #: When its handshake started.
        self.started = 0.0
        #: Its protocol was made: the loop owns the socket now.
        self.made = False
        #: Its handshake is done.
        self.done = False


class _Handshaking(asyncio.Protocol):
    """Stands for the served protocol until the handshake is done, then steps aside.

    The handshake's task resumes a turn of the loop after the handshake is
    done; this tells the listener at once, so that the slot is not abandoned
    in between. A TLS transport calls its protocol first with
    ``connection_made``, when the handshake is done; that hands the transport
    to the served protocol, which every later call reaches directly.
    """

    def __init__(self, inner: asyncio.Protocol, done: Callable[[], None]) -> None:
        self._inner = inner
        self._done = done

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.set_protocol(self._inner)
        self._done()
        self._inner.connection_made(transport)


class BoundedTlsListener:
    """Serves ``factory``'s protocol over TLS on host:port."""

    def __init__(
        self,
        factory: Callable[[], asyncio.Protocol],
        host: str,
        port: int,
        ssl_context: ssl.SSLContext,
        *,
        limit: int = DEFAULT_HANDSHAKES,
        handshake_timeout: float = DEFAULT_TIMEOUT,
        held: int = DEFAULT_HELD,
        grace: float = DEFAULT_GRACE,
        backlog: int = 4096,
    ) -> None:
        self._factory = factory
        self._host = host
        self._port = port
        self._ssl = ssl_context
        self._handshake_timeout = handshake_timeout
        self._backlog = backlog
        #: Which connections handshake now (the policy; also read for metrics).
        self.admission: HandshakeAdmission[_Pending] = HandshakeAdmission(limit, held, grace)
        self._socket: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._pending: set[_Pending] = set()
        self._recheck: asyncio.TimerHandle | None = None
        self._stopped = False
        self._quiet_until = 0.0
        #: Told each handshake done, and how many seconds it took from its start.
        self.observe_handshake: Callable[[float], None] | None = None

    async def start(self) -> int:
        """Listen; return the bound port (useful with port 0)."""
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        listener = socket.create_server(
            (self._host, self._port), family=family, backlog=self._backlog
        )
        listener.setblocking(False)
        self._socket = listener
        self._accepting = asyncio.create_task(self._accept_forever(), name="TLS listener")
        port: int = listener.getsockname()[1]
        return port

    async def stop(self) -> None:
        """Stop accepting; abandon handshakes not yet finished."""
        self._stopped = True
        if self._recheck is not None:
            self._recheck.cancel()
        tasks: list[asyncio.Task[Any]] = [self._accepting] if self._accepting else []
        for pending in list(self._pending):
            if pending.task is None:
                self.admission.gone(pending)
                self._close(pending)
            else:
                tasks.append(pending.task)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    async def _accept_forever(self) -> None:
        assert self._socket is not None
        loop = asyncio.get_running_loop()
        accepted = 0
        while True:
            try:
                connection, address = await loop.sock_accept(self._socket)
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE):
                    # Out of file descriptors: the busiest address gives one back.
                    victim = self.admission.make_room()
                    if victim is not None:
                        self._close(victim)
                        continue
                self._warn_cannot_accept(loop, exc)
                await asyncio.sleep(0.1)  # back off a moment, keep serving
                continue
            self._accepted(loop, connection, address[0])
            accepted += 1
            if accepted % _ACCEPTS_PER_TURN == 0:
                await asyncio.sleep(0)

    def _warn_cannot_accept(self, loop: asyncio.AbstractEventLoop, exc: OSError) -> None:
        if loop.time() >= self._quiet_until:
            self._quiet_until = loop.time() + _ACCEPT_WARNING_INTERVAL
            logger.warning("cannot accept a connection: %s", exc)

    def _accepted(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, host: str) -> None:
        pending = _Pending(sock, loop.time() + self._handshake_timeout)
        self._pending.add(pending)
        victim = self.admission.accepted(pending, host)
        if victim is not None:
            self._close(victim)
        if victim is pending:
            return
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, pending.needed)
        except OSError:  # reset already
            self._drop(pending)
            return
        start_by = pending.deadline - min(_LEAST_HANDSHAKE_TIME, self._handshake_timeout / 2)
        pending.expiry = loop.call_at(start_by, self._expired, pending)
        loop.add_reader(sock.fileno(), self._readable, pending)

    def _readable(self, pending: _Pending) -> None:
        """The kernel holds ``pending.needed`` bytes, or the client closed or reset."""
        sock = pending.sock
        try:
            head = sock.recv(max(pending.needed, _FIRST_LOOK), socket.MSG_PEEK)
            if not head:
                self._drop(pending)
                return
            needed = client_hello_needs(head)
            if needed is None:
                self.admission.gone(pending, not_tls=True)
                self._close(pending)
                return
            if needed > len(head) >= pending.needed:
                # Part of it: wait for the rest (more than this time, so never a spin).
                pending.needed = needed
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, pending.needed)
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    self._drop(pending)  # reset: uvloop would not wake us again
                return
            # The whole ClientHello; or fewer bytes than asked for, which the
            # kernel reports only at the client's end of data (or under memory
            # pressure): the handshake tells which, at once.
            asyncio.get_running_loop().remove_reader(sock.fileno())
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
        except BlockingIOError:
            return
        except OSError:  # reset
            self._drop(pending)
            return
        self.admission.ready(pending)
        self._pump()

    def _expired(self, pending: _Pending) -> None:
        """No handshake started in time: the client is too slow, or too many wait."""
        pending.expiry = None
        self.admission.gone(pending, timed_out=True)
        self._close(pending)

    def _drop(self, pending: _Pending) -> None:
        """The client closed or reset before its handshake started."""
        self.admission.gone(pending)
        self._close(pending)

    def _close(self, pending: _Pending) -> None:
        """Close a connection whose handshake has not started."""
        self._pending.discard(pending)
        if pending.expiry is not None:
            pending.expiry.cancel()
            pending.expiry = None
        with contextlib.suppress(OSError, ValueError):
            asyncio.get_running_loop().remove_reader(pending.sock.fileno())
        pending.sock.close()

    def _pump(self) -> None:
        """Start and abandon handshakes as the policy says."""
        if self._stopped:
            return
        loop = asyncio.get_running_loop()
        schedule = self.admission.schedule(loop.time())
        for victim in schedule.abandon:
            assert victim.task is not None
            victim.task.cancel()  # the loop closes its socket
        for pending in schedule.start:
            self._start(loop, pending)
        if self._recheck is not None:
            self._recheck.cancel()
            self._recheck = None
        if schedule.recheck_at is not None:
            self._recheck = loop.call_at(schedule.recheck_at, self._pump)

    def _start(self, loop: asyncio.AbstractEventLoop, pending: _Pending) -> None:
        if pending.expiry is not None:
            pending.expiry.cancel()
            pending.expiry = None
        task: asyncio.Task[object] = asyncio.create_task(
            loop.connect_accepted_socket(
                functools.partial(self._protocol, pending),
                pending.sock,
                ssl=self._ssl,
                ssl_handshake_timeout=max(pending.deadline - loop.time(), 0.001),
            )
        )
        pending.task = task
        pending.started = loop.time()
        task.add_done_callback(functools.partial(self._ended, pending))

    def _protocol(self, pending: _Pending) -> asyncio.Protocol:
        pending.made = True
        return _Handshaking(self._factory(), functools.partial(self._done, pending))

    def _done(self, pending: _Pending) -> None:
        """``pending``'s handshake is done: its slot is free."""
        pending.done = True
        self._pending.discard(pending)
        self.admission.finished(pending)
        if self.observe_handshake is not None:
            self.observe_handshake(asyncio.get_running_loop().time() - pending.started)
        self._pump()

    def _ended(self, pending: _Pending, task: asyncio.Task[object]) -> None:
        """``pending``'s handshake task ended: done, failed or abandoned."""
        if not task.cancelled():
            # A failed handshake (bad certificate, timeout, probe) has closed
            # its socket; there is nothing else to do with it.
            task.exception()
        pending.task = None  # the task's result refers to it: no cycle keeps the connection
        if pending.done:
            return
        if not pending.made:  # abandoned before its protocol was made: the socket is ours
            pending.sock.close()
        self._pending.discard(pending)
        self.admission.finished(pending)
        self._pump()
