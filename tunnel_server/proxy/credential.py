"""What a proxied request was let through with, kept while it lasts.

The live requests (:mod:`tunnel_server.proxy.live_requests`) check it again
whenever access changes. Interpreted, not compiled: a connection's requests
share one, made when the server decides for the first of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Credential"]


@dataclass(frozen=True, slots=True)
class Credential:
    """What a proxied request was let through with; requests of one connection share it."""

    #: The hash of the caller's API token (the token itself is not kept).
    token_hash: str = field(repr=False)
    #: The user the token named.
    user: str
    cluster: str
    #: The caller's own ``Impersonate-*`` headers (names in lower case); usually none.
    requested: tuple[tuple[str, str], ...]
    #: The ``Impersonate-*`` headers forwarded: who the cluster was told the caller is
    #: (a set: the order of the groups does not change who that is).
    identity: frozenset[tuple[str, str]]
