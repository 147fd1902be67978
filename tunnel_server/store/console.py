"""The records of what the web console keeps in the store, and asks of it.

A console session is the server-side half of a browser's sign-in
(:mod:`tunnel_server.console.sessions`): the browser holds a random session id
in a cookie, the store only its SHA-256 hash, with the user and the API token
the person signed in with. Every replica sharing the store honours it. A
session goes with its token: revoking the token, or the user, deletes it.

The console also asks what the REST API does not: the commands waiting or
running per cluster (the fleet page), and the audit trail searched by every
field an operator filters on (verb, status, a time range): :class:`AuditQuery`.
The methods are the "console" section of :class:`tunnel_server.store.base.Store`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

__all__ = ["MAX_AUDIT_SEARCH", "AuditQuery", "ConsoleSession"]

#: The most events one ``Store.search_audit`` returns (an export's size).
MAX_AUDIT_SEARCH = 10_000


@dataclass(frozen=True, slots=True)
class ConsoleSession:
    """A signed-in browser: the hash of its session id, whose it is, until when."""

    session_hash: str
    user: str
    #: The hash of the API token the person signed in with: the session lives no longer.
    token_hash: str
    created_at: datetime
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class AuditQuery:
    """Filters of an audit search; None matches anything. ``until`` is exclusive."""

    user: str | None = None
    cluster: str | None = None
    kind: str | None = None
    verb: str | None = None
    status: int | None = None
    since: datetime | None = None
    until: datetime | None = None
    limit: int = 100
