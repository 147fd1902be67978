"""The server's TLS listener: handshakes bounded, and no address can hold them all.

asyncio's own server accepts every connection at once and advances all their
TLS handshakes together; when thousands of agents reconnect after a restart,
none finishes for seconds and then hundreds do at once (docs/benchmarks.md,
"Idle agents"). This listener runs at most ``limit`` handshakes at once.
Which connections take those slots, and which are let go, is
:mod:`tunnel_server.handshakes`' policy; this module does the I/O: it accepts
every connection, has the kernel wake it when the connection's first TLS
record (the ClientHello) is whole, starts and abandons handshakes as the policy
says, and closes a connection whose handshake is not done by its deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable
from typing import Any

from .handshakes import DEFAULT_GRACE, DEFAULT_HELD, HandshakeAdmission

__all__ = ["BoundedTlsListener"]

logger = logging.getLogger(__name__)

#: A TLS record's header: content type, version, length (RFC 8446, 5.1).
_RECORD_HEADER = 5
_HANDSHAKE_RECORD = 22
#: The largest record a ClientHello may come in (2^14 bytes of plaintext).
_MAX_RECORD = 2**14


class _Pending:
    """An accepted connection, from its accept until its handshake ends."""

    __slots__ = ("deadline", "expiry", "needed", "sock", "started", "task")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        #: When its handshake must be done (the loop's clock).
        self.deadline = deadline
        self.expiry: asyncio.TimerHandle | None = None
        #: Bytes of the ClientHello's record the kernel is to wait for.
        self.needed = _RECORD_HEADER
        self.task: asyncio.Task[object] | None = None
        #: When its handshake started.
        self.started = 0.0


class BoundedTlsListener:
    """Serves ``factory``'s protocol over TLS on host:port."""

    def __init__(
        self,
        factory: Callable[[], asyncio.Protocol],
        host: str,
        port: int,
        ssl_context: ssl.SSLContext,
        *,
        limit: int = 64,
        handshake_timeout: float = 10.0,
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
        while True:
            try:
                connection, address = await loop.sock_accept(self._socket)
            except OSError as exc:  # e.g. EMFILE: back off a moment, keep serving
                logger.warning("cannot accept a connection: %s", exc)
                await asyncio.sleep(0.1)
                continue
            self._accepted(loop, connection, address[0])

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
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, _RECORD_HEADER)
        except OSError:  # reset already
            self._drop(pending)
            return
        pending.expiry = loop.call_at(pending.deadline, self._expired, pending)
        loop.add_reader(sock.fileno(), self._readable, pending)
        self._pump()

    def _readable(self, pending: _Pending) -> None:
        """The kernel holds ``pending.needed`` bytes, or the client closed or reset."""
        try:
            head = pending.sock.recv(_RECORD_HEADER + _MAX_RECORD, socket.MSG_PEEK)
            if not head:
                self._drop(pending)
                return
            if pending.needed == _RECORD_HEADER:
                needed = _whole_hello_needs(head)
                if needed > len(head) >= _RECORD_HEADER:
                    pending.needed = needed
                    pending.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, needed)
                    return  # woken again when the rest is in (or at the client's end)
            # The whole ClientHello record; or fewer bytes than asked for,
            # which the kernel reports only at the client's end of data (or
            # under memory pressure); or not TLS. The handshake tells which.
            asyncio.get_running_loop().remove_reader(pending.sock.fileno())
            pending.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
        except BlockingIOError:
            return
        except OSError:  # reset
            self._drop(pending)
            return
        self.admission.ready(pending)
        self._pump()

    def _expired(self, pending: _Pending) -> None:
        """No handshake started by the deadline: the client is too slow, or too many wait."""
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
                self._factory,
                pending.sock,
                ssl=self._ssl,
                ssl_handshake_timeout=max(pending.deadline - loop.time(), 0.001),
            )
        )
        pending.task = task
        pending.started = loop.time()
        task.add_done_callback(lambda done: self._finished(done, pending))

    def _finished(self, task: asyncio.Task[object], pending: _Pending) -> None:
        self._pending.discard(pending)
        self.admission.finished(pending)
        # A failed handshake (bad certificate, timeout, probe) has closed its
        # socket; there is nothing else to do with it.
        done = not task.cancelled() and task.exception() is None
        if done and self.observe_handshake is not None:
            self.observe_handshake(asyncio.get_running_loop().time() - pending.started)
        self._pump()


def _whole_hello_needs(head: bytes) -> int:
    """The bytes up to the end of the first record, whose header ``head`` starts with.

    Just the header's five when it is not a TLS handshake record of a valid
    length: the handshake then fails at once, with an alert.
    """
    if len(head) < _RECORD_HEADER or head[0] != _HANDSHAKE_RECORD:
        return _RECORD_HEADER
    length = int.from_bytes(head[3:5], "big")
    return _RECORD_HEADER + length if 0 < length <= _MAX_RECORD else _RECORD_HEADER
