"""A session's clock: its connection ticked at each deadline it names.

The sans-I/O connection never reads a clock (docs/protocol.md, "Liveness"):
it says when it must next be ticked, for the keepalive PING, the keepalive's
deadline or a probe's. :class:`SessionTimer` sleeps until then, and wakes
early when new work for a quiet peer sent a probe whose deadline is sooner.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from protocol import Connection, KeepaliveTimeoutError, ProtocolError

from .errors import SessionClosedError, SessionError, SessionTimeoutError

__all__ = ["SessionTimer"]

logger = logging.getLogger("tunnel_mux.session")


class SessionTimer:
    """Ticks one connection at its deadlines, for the session that owns both."""

    def __init__(self, connection: Connection, clock: Callable[[], float], label: str) -> None:
        self._connection = connection
        self._clock = clock
        self._label = label
        # The sleep, while it lasts: a probe may need it to end sooner.
        self._waiter: asyncio.Future[None] | None = None

    async def run(self, kick: Callable[[], None], end: Callable[[SessionError], None]) -> None:
        """Tick until the connection closes: ``kick`` the writer when a PING is
        queued; ``end`` the session, with SessionTimeoutError for a silent peer."""
        connection = self._connection
        while not connection.closed:
            try:
                connection.tick(self._clock())
            except ProtocolError as exc:
                logger.warning("%s: %s", self._label, exc)
                timed_out = isinstance(exc, KeepaliveTimeoutError)
                end((SessionTimeoutError if timed_out else SessionClosedError)(str(exc)))
                kick()
                return
            if connection.wants_to_send:
                kick()  # a PING to send; otherwise leave the writer asleep
            # Sleep until the connection's next deadline: with traffic flowing
            # it moves later, and this wakes at most once per interval.
            deadline = connection.deadline()
            now = self._clock()
            interval = connection.keepalive.interval
            await self._sleep(interval if deadline is None else max(deadline - now, 0.0))

    def probe(self) -> None:
        """New work depends on the peer: if it has been quiet, PING it and watch the deadline."""
        if self._connection.probe(self._clock()) and self._waiter is not None:
            _wake(self._waiter)

    async def _sleep(self, delay: float) -> None:
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        handle = loop.call_later(delay, _wake, waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            handle.cancel()
            raise
        handle.cancel()
        self._waiter = None


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
