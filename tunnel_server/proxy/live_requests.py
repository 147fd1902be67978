"""The proxied requests in progress, checked again when access changes.

A watch, a ``logs -f``, an exec session or a port-forward may last for days,
and the server checked its caller's token and grant once, when it opened. So
whenever access changes (a user, a token or a grant is deleted or changed),
every live request is checked again as a new one would be: the token must
still name a user, the user must still have a grant on the cluster, and the
identity the cluster was told (``Impersonate-User``/``-Group``) must be the one
the server would assert now. A request that fails is ended: its stream is
reset (code ``HTTP_ACCESS_REVOKED``, the refusal as its reason), so the agent
ends the request at the API server, and the front end tells the caller
(:func:`tunnel_server.proxy.refusal.revocation_event`).

Changes made through this server's API apply at once: the API call returns
after the requests of the user or cluster it changed were checked, and says
how many it ended. Changes made to the store by anything else, and tokens
reaching their expiry, apply at the next periodic check of every request,
every :data:`RECHECK_INTERVAL` seconds (plus the access cache's time to live).
A store that cannot be read ends nothing: an outage is not a revocation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from protocol.kinds import HTTP_ACCESS_REVOKED
from tunnel_mux import MuxStream
from tunnel_server.access.cache import AccessCache
from tunnel_server.proxy.credential import Credential
from tunnel_server.proxy.exchange import ProxyExchange
from tunnel_server.store.base import StoreError

__all__ = ["RECHECK_INTERVAL", "LiveRequests"]

logger = logging.getLogger(__name__)

#: Seconds between two checks of the live requests when nothing on this server
#: changed access (the changes made elsewhere apply within this time).
RECHECK_INTERVAL = 30.0


class LiveRequests:
    """The proxied requests in progress: each one's stream, credential and exchange."""

    def __init__(
        self,
        access: AccessCache,
        refusal: Callable[[Credential], Awaitable[str | None]],
        *,
        interval: float = RECHECK_INTERVAL,
        on_ended: Callable[[int], None] = lambda count: None,
    ) -> None:
        """``refusal(credential)`` says why a new request with it would be refused, or None.

        It may raise :class:`StoreError`: that credential's requests then go
        on. ``on_ended(count)`` is told each time a check ended ``count``
        requests.
        """
        self._access = access
        self._refusal = refusal
        self._on_ended = on_ended
        self._interval = interval
        self._live: dict[MuxStream, tuple[Credential, ProxyExchange]] = {}
        #: Requests in progress per (user, cluster).
        self._counts: dict[tuple[str, str], int] = {}
        self._due = asyncio.Event()

    def __len__(self) -> int:
        return len(self._live)

    def count(self, user: str, cluster: str) -> int:
        """How many requests ``user`` has in progress on ``cluster``."""
        return self._counts.get((user, cluster), 0)

    def add(
        self,
        stream: MuxStream,
        credential: Credential,
        generation: int,
        exchange: ProxyExchange,
    ) -> None:
        """Hold the request on ``stream`` until :meth:`discard`.

        It was let through with ``credential``, on answers read at access
        ``generation``; ``exchange`` is what it has done so far (see
        :meth:`requests`). If access changed since that generation, the check
        that went with the change may have missed the request: it is checked
        again soon.
        """
        self._live[stream] = (credential, exchange)
        key = (credential.user, credential.cluster)
        self._counts[key] = self._counts.get(key, 0) + 1
        if generation != self._access.generation:
            self._due.set()

    def discard(self, stream: MuxStream) -> None:
        """Forget a stream whose request has ended."""
        held = self._live.pop(stream, None)
        if held is not None:
            self._uncount(held[0])

    def _uncount(self, credential: Credential) -> None:
        key = (credential.user, credential.cluster)
        left = self._counts[key] - 1
        if left:
            self._counts[key] = left
        else:
            del self._counts[key]

    def requests(self) -> list[ProxyExchange]:
        """The exchanges of the requests in progress, the oldest first."""
        return sorted((exchange for _, exchange in self._live.values()), key=_started)

    async def access_changed(self, *, user: str | None = None, cluster: str | None = None) -> int:
        """Forget the cached access, then end the requests it no longer allows; how many.

        Only the requests of ``user``, or to ``cluster``, if given: what the
        change can have touched. If this check does not finish (the API call
        that asked for it was cancelled), the periodic one does the rest now.
        """
        self._access.invalidate()
        try:
            return await self.check(user=user, cluster=cluster)
        except BaseException:
            self._due.set()
            raise

    async def check(self, *, user: str | None = None, cluster: str | None = None) -> int:
        """End the requests whose credential would now be refused; how many.

        Only those of ``user``, or to ``cluster``, if given.
        """
        by_credential: dict[Credential, list[MuxStream]] = {}
        for stream, (credential, _) in self._live.items():
            if (user is None or credential.user == user) and (
                cluster is None or credential.cluster == cluster
            ):
                by_credential.setdefault(credential, []).append(stream)
        ended = 0
        unreadable: list[StoreError] = []
        for credential, streams in by_credential.items():
            try:
                refusal = await self._refusal(credential)
            except StoreError as exc:
                unreadable.append(exc)
                continue
            if refusal is not None:
                ended += self._end(credential, streams, refusal)
        if unreadable:
            logger.warning(
                "cannot check the access of %d credential(s) of live requests now; "
                "their requests go on: %s",
                len(unreadable),
                unreadable[-1],
            )
        return ended

    def _end(self, credential: Credential, streams: list[MuxStream], refusal: str) -> int:
        # Not those that ended during the check, nor those already failed (their
        # agent went away): they are ending on their own, and were not revoked.
        ending = [
            stream
            for stream in streams
            if stream.error is None and self._live.pop(stream, None) is not None
        ]
        for stream in ending:
            self._uncount(credential)
            stream.reset(HTTP_ACCESS_REVOKED, refusal)
        if ending:
            self._on_ended(len(ending))
            logger.warning(
                "ended %d live request(s): %s",
                len(ending),
                refusal,
                extra={"cluster": credential.cluster},
            )
        return len(ending)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Check the live requests periodically, and when asked, while the block runs."""
        task = asyncio.create_task(self._check_forever(), name="live request checks")
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _check_forever(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._due.wait(), self._interval)
            self._due.clear()
            try:
                # With the access cache as it is: its answers are at most its time
                # to live old, and clearing it would make every connection ask again.
                await self.check()
            except Exception:
                # The next check may succeed; a dead loop would end revocations silently.
                logger.exception("checking the live requests failed")


def _started(exchange: ProxyExchange) -> float:
    return exchange.started
