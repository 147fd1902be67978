"""One proxied request as the server records it.

Both proxy front ends (the edge's lean path and aiohttp's route) fill in a
:class:`ProxyExchange` as the request goes: who asked, what it meant, how it
ended; its audit event and metrics are made from it, and the live requests
(:mod:`tunnel_server.proxy.live_requests`) list it while it lasts. The types
live here, below everything that uses them, so that the request's way, its
refusals and the live-request table need not import one another.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tunnel_cli import printable
from tunnel_mux import MuxStream, SessionClosedError, SessionError
from tunnel_server.proxy.refusal import ProxyRefusal, revoked_reason

__all__ = ["MAX_ENDED_CHARS", "ProxyExchange"]

#: The most of :attr:`ProxyExchange.ended` an audit event keeps.
MAX_ENDED_CHARS = 512


@dataclass(slots=True, init=False)
class ProxyExchange:
    """One proxied request, as its audit event and metrics record it."""

    cluster: str
    method: str
    started: float
    user: str | None
    verb: str
    path: str
    status: int
    bytes_in: int
    bytes_out: int
    #: Why the request ended without its whole answer: a refusal's message, or
    #: what cut the answer short. Empty when it was answered in full.
    ended: str
    #: The request's stream, while the server's live requests hold it.
    stream: MuxStream | None
    #: Who the cluster was told the caller is, as JSON for the audit event
    #: (:func:`~tunnel_server.proxy.credential.recorded_identity`); empty until decided.
    identity: str
    #: The replica that held the cluster's agent and served the request, when it was
    #: forwarded to another; empty when this one served it.
    served_by: str

    def __init__(self, cluster: str, method: str) -> None:
        self.cluster = cluster
        self.method = method
        self.started = time.monotonic()
        self.user = None
        self.verb = ""
        self.path = ""
        self.status = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.ended = ""
        self.stream = None
        self.identity = ""
        self.served_by = ""

    def refused(self, refusal: ProxyRefusal) -> None:
        """The request is answered with ``refusal``'s status: both go in its audit event."""
        self.status = refusal.code
        self.ended = printable(refusal.message[:MAX_ENDED_CHARS])

    def cut_short(self, why: str | BaseException) -> None:
        """The answer began, and ``why`` ended it before its end.

        Access revoked is said as such (the stream's reset says it only as a code).
        """
        if isinstance(why, SessionClosedError):
            why = f"the session with the cluster's agent ended: {why}"
        elif isinstance(why, SessionError):
            revoked = revoked_reason(why)
            why = f"access revoked: {revoked}" if revoked is not None else f"cut short: {why}"
        # Bounded, and without the control characters an agent's reason may
        # carry: the audit trail is read in terminals (tunnelctl audit).
        self.ended = printable(str(why)[:MAX_ENDED_CHARS])
