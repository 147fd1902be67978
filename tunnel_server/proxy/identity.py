"""Who the cluster is told a proxied request's caller is, and what else of its headers it gets.

Every request reaches the API server as ``tunnel:<user>`` in ``tunnel:<group>``
groups, by impersonation (docs/security.md); a caller's own ``Impersonate-*``
headers pass only with an impersonate grant, inside the same prefix. The
caller's credentials, hop-by-hop headers and claims of a client address never
go on; other identity headers (``X-Remote-*``, or ``Impersonate-*`` spelled
with ``_``) are refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from protocol.http import CLIENT_ADDRESS, HOP_BY_HOP
from tunnel_server.access.cache import AccessCache
from tunnel_server.proxy.credential import Credential
from tunnel_server.proxy.refusal import ProxyRefusal
from tunnel_server.store.base import Grant, User

__all__ = [
    "GROUP_TARGET",
    "IDENTITY_PREFIX",
    "access_refusal",
    "forwarded_headers",
    "identity_headers",
    "impersonation_headers",
]

#: Every identity the server asserts in a cluster carries this prefix.
IDENTITY_PREFIX = "tunnel:"
#: How a group is named among an impersonate grant's targets (a bare name is a user).
GROUP_TARGET = "group:"

# Never forwarded: hop-by-hop headers, the caller's own credentials, and what
# the caller says of its address. kube-apiserver writes X-Forwarded-For and
# X-Real-Ip into its audit events' sourceIPs; proxies and webhooks read the
# others. A caller's word on its address is not this server's to pass on.
_DROPPED = (
    HOP_BY_HOP
    | CLIENT_ADDRESS
    | {
        "authorization",
        "proxy-authorization",
        "cookie",
        "host",
    }
)
#: Dropped whatever follows: X-Forwarded-For, -Host, -Proto, -Port, -Server ...
_DROPPED_PREFIX = "x-forwarded-"
#: Headers that name an identity, other than the Impersonate-* ones the server
#: writes: the API server's front-proxy headers (--requestheader-*-headers'
#: defaults), and Impersonate-* spelled with "_", which a proxy that reads "_"
#: as "-" (as CGI-style servers do) would honour. A caller sending one is
#: trying something: refused, not dropped.
_IDENTITY_SHAPED = ("impersonate-", "x-remote-")


def impersonation_headers(user: User, grant: Grant) -> list[tuple[str, str]]:
    """The identity the cluster sees: ``tunnel:<user>`` in ``tunnel:<group>`` groups."""
    headers = [("impersonate-user", IDENTITY_PREFIX + user.name)]
    for group in dict.fromkeys((*user.groups, *grant.as_groups)):
        headers.append(("impersonate-group", IDENTITY_PREFIX + group))
    return headers


def forwarded_headers(
    headers: Iterable[tuple[str, str]], upgrade: str | None, user: User, grant: Grant
) -> list[tuple[str, str]]:
    """The caller's headers as the agent gets them: no credentials, our identity.

    Raises :class:`ProxyRefusal` for a header that names an identity other
    than ``Impersonate-*`` (``X-Remote-User``, ``Impersonate_User``).
    """
    forwarded: list[tuple[str, str]] = []
    impersonated: list[tuple[str, str]] = []
    for name, value in headers:
        if name.startswith("impersonate-"):
            impersonated.append((name, value))
        elif _passes(name, upgrade is not None):
            forwarded.append((name, value))
    if upgrade is not None:
        forwarded.append(("connection", "Upgrade"))
        forwarded.append(("upgrade", upgrade))
    forwarded.extend(identity_headers(impersonated, user, grant))
    return forwarded


def _passes(name: str, upgrade: bool) -> bool:
    """Whether the caller's header ``name`` (lower case, not ``impersonate-*``) goes on.

    Read as a proxy that takes "_" for "-" would read it, so that no spelling
    slips past: ``X_Real_Ip`` is dropped as ``X-Real-Ip`` is. Raises
    :class:`ProxyRefusal` for a header that names an identity.
    """
    folded = name.replace("_", "-")
    if folded.startswith(_IDENTITY_SHAPED):
        raise _identity_shaped_refusal(name, folded)
    if folded in _DROPPED or folded.startswith(_DROPPED_PREFIX):
        return False
    if folded == "content-length":
        # An upgrade carries no body; a second length in disguise frames nothing.
        return not upgrade and folded == name
    return True


def _identity_shaped_refusal(name: str, folded: str) -> ProxyRefusal:
    """The 403 for a caller's header that names an identity other than by Impersonate-*."""
    spelled = (
        ""
        if folded == name
        else f" (a proxy that reads '_' as '-' would take it for {folded[:64]})"
    )
    if folded.startswith("x-remote-"):
        why = (
            "X-Remote-* headers name an identity to an API server behind an authenticating "
            "proxy; the cluster learns who the caller is from this server alone"
        )
    else:
        why = "impersonation goes in Impersonate-User and Impersonate-Group only (kubectl --as)"
    return ProxyRefusal(403, "Forbidden", f"the {name[:64]} header is refused{spelled}: {why}")


def identity_headers(
    requested: Sequence[tuple[str, str]], user: User, grant: Grant
) -> list[tuple[str, str]]:
    """The ``Impersonate-*`` headers that tell the cluster who the caller is.

    ``requested`` are the caller's own (names in lower case): its
    ``--as``/``--as-group``, refused unless the grant allows them. Without
    them, ``tunnel:<user>`` in the user's and the grant's groups.
    """
    if requested:
        return _caller_impersonation(requested, user, grant)
    return impersonation_headers(user, grant)


async def access_refusal(access: AccessCache, credential: Credential) -> str | None:
    """Why a new request with ``credential`` would be refused now; None if it would not.

    Raises :class:`StoreError` if the store cannot be read.
    """
    _, user = await access.lookup_user_by_hash(credential.token_hash)
    if user is None:
        return "the caller's API token expired or was revoked, or its user was deleted"
    _, grant = await access.lookup_grant(user.name, credential.cluster)
    if grant is None:
        return f"user {user.name} no longer has a grant on cluster {credential.cluster}"
    try:
        identity = frozenset(identity_headers(credential.requested, user, grant))
    except ProxyRefusal as refusal:
        return refusal.message
    if identity != credential.identity:
        return f"the identity of user {user.name} on cluster {credential.cluster} changed"
    return None


def _caller_impersonation(
    requested: Sequence[tuple[str, str]], user: User, grant: Grant
) -> list[tuple[str, str]]:
    """The caller's own --as/--as-group, allowed only by its grant, inside our prefix."""
    if not grant.impersonate:
        raise ProxyRefusal(
            403,
            "Forbidden",
            f"user {user.name} may not impersonate on this cluster "
            "(Impersonate-* headers are refused without an impersonate grant)",
        )
    headers = []
    for name, value in requested:
        if name not in ("impersonate-user", "impersonate-group"):
            raise ProxyRefusal(403, "Forbidden", f"the {name} header is not supported")
        if value.startswith("system:") or not value or len(value) > 256:
            raise ProxyRefusal(403, "Forbidden", f"{value[:64]!r} cannot be impersonated")
        prefixed = value if value.startswith(IDENTITY_PREFIX) else IDENTITY_PREFIX + value
        if prefixed.startswith(IDENTITY_PREFIX + "system"):
            # As the agent refuses it: the server does not lean on the agent's check alone.
            raise ProxyRefusal(403, "Forbidden", f"{value[:64]!r} cannot be impersonated")
        headers.append((name, prefixed))
    if not any(name == "impersonate-user" for name, _ in headers):
        raise ProxyRefusal(403, "Forbidden", "Impersonate-Group needs Impersonate-User")
    if grant.impersonate_targets:
        _check_targets(headers, user, grant)
    return headers


def _check_targets(headers: Sequence[tuple[str, str]], user: User, grant: Grant) -> None:
    """Refuse an identity the grant's targets do not name.

    Users named are who the caller may become; ``group:NAME`` entries are the
    groups it may claim. A grant naming groups only lets its user claim them
    under its own name.
    """
    targets = grant.impersonate_targets
    users = {target for target in targets if not target.startswith(GROUP_TARGET)}
    groups = {target[len(GROUP_TARGET) :] for target in targets if target.startswith(GROUP_TARGET)}
    for name, value in headers:
        plain = value[len(IDENTITY_PREFIX) :]
        if name == "impersonate-user" and plain not in users and plain != user.name:
            whom = plain
        elif name == "impersonate-group" and plain not in groups:
            whom = f"group {plain}"
        else:
            continue
        raise ProxyRefusal(
            403,
            "Forbidden",
            f"user {user.name} may not impersonate {whom[:64]} on this cluster "
            f"(the grant allows: {', '.join(targets)})",
        )
