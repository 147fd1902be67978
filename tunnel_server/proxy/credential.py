"""What a proxied request was let through with, kept while it lasts.

The live requests (:mod:`tunnel_server.proxy.live_requests`) check it again
whenever access changes. Interpreted, not compiled: a connection's requests
share one, made when the server decides for the first of them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["Credential", "recorded_identity"]


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
    #: The identity as the request's audit event records it (:func:`recorded_identity`).
    recorded: str = ""


def recorded_identity(forwarded: Iterable[tuple[str, str]], impersonated: bool) -> str:
    """Who the cluster was told the caller is, as JSON for the audit event's ``as``.

    ``{"user": "tunnel:alice", "groups": [...], "impersonated": true}`` from the
    ``Impersonate-*`` headers sent; ``impersonated`` says they came from the
    caller's own ``Impersonate-*`` (kubectl ``--as``) rather than its user and grant.
    """
    user = ""
    groups = []
    for name, value in forwarded:
        if name == "impersonate-user":
            user = value
        elif name == "impersonate-group":
            groups.append(value)
    return json.dumps(
        {"user": user, "groups": groups, "impersonated": impersonated}, separators=(",", ":")
    )
