"""The REST API for users, grants, kubeconfigs, the audit trail and the kubectl requests
in progress, under /api/v1."""

from __future__ import annotations

import base64
import logging
import re
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import yaml
from aiohttp import web

from tunnel_cli import FlagError, describe_duration, parse_duration
from tunnel_server.access.auth import (
    authenticate,
    bearer_token,
    confirm,
    invalid_token,
    require_admin,
)
from tunnel_server.api.httpjson import json_response, read_json, require_str, timestamp
from tunnel_server.clock import utcnow
from tunnel_server.config import MAX_API_TOKEN_TTL, MIN_API_TOKEN_TTL
from tunnel_server.context import CONTEXT, ServerContext
from tunnel_server.errors import ApiError, BadRequestError, ForbiddenError
from tunnel_server.proxy.exchange import ProxyExchange
from tunnel_server.proxy.identity import GROUP_TARGET, IDENTITY_PREFIX
from tunnel_server.statedir import new_token
from tunnel_server.store.base import AuditEvent, Grant, User, hash_token

__all__ = [
    "Recheck",
    "apply_grant",
    "audit_view",
    "create_user",
    "issue_kubeconfig",
    "remove_grant",
    "revoke_tokens",
    "setup_user_api",
    "validate_principal",
]

logger = logging.getLogger(__name__)

_PRINCIPAL = re.compile(r"[a-z0-9]([a-z0-9._@-]{0,62}[a-z0-9])?")
_ALLOWED_NAMES = (
    "1-64 characters of a-z, 0-9, '.', '_', '@', '-', starting and ending with a letter or "
    "digit, and not beginning with 'system'"
)
_MAX_GROUPS = 32
#: The most users and groups one grant may allow its user to impersonate.
_MAX_IMPERSONATE_TARGETS = 32


def validate_principal(name: str, what: str) -> str:
    """A user or group name: lower-case, 1..64 of a-z 0-9 . _ @ -, not ``system...``.

    The whole name must match (a final newline is no part of a name). Names
    beginning with ``system`` are refused here because every agent refuses the
    identity they would make (``tunnel:system...``, too close to Kubernetes'
    reserved ``system:``): a user or group so named could never reach a cluster.
    """
    if not _PRINCIPAL.fullmatch(name):
        raise BadRequestError(f"{what} {name[:64]!r} is not allowed: names are {_ALLOWED_NAMES}")
    if name.startswith("system"):
        raise BadRequestError(
            f"{what} {name[:64]!r} is not allowed: every agent refuses identities beginning "
            f"with tunnel:system (Kubernetes reserves system:); names are {_ALLOWED_NAMES}"
        )
    return name


def setup_user_api(app: web.Application) -> None:
    router = app.router
    router.add_get("/api/v1/users", list_users)
    router.add_post("/api/v1/users", add_user)
    router.add_delete("/api/v1/users/{user}", delete_user)
    router.add_post("/api/v1/users/{user}/tokens", new_user_token)
    router.add_delete("/api/v1/users/{user}/tokens", revoke_user_tokens)
    router.add_post("/api/v1/users/{user}/kubeconfig", new_kubeconfig)
    router.add_get("/api/v1/grants", list_grants)
    router.add_put("/api/v1/grants/{user}/{cluster}", set_grant)
    router.add_delete("/api/v1/grants/{user}/{cluster}", delete_grant)
    router.add_get("/api/v1/audit", list_audit)
    router.add_get("/api/v1/requests", list_requests)


async def list_users(request: web.Request) -> web.Response:
    await require_admin(request)
    users = await request.app[CONTEXT].store.list_users()
    return json_response([_user_view(user) for user in users])


async def add_user(request: web.Request) -> web.Response:
    admin = await require_admin(request)
    context = request.app[CONTEXT]
    body = await read_json(request)
    name = validate_principal(require_str(body, "name", max_length=64), "user name")
    groups = _groups(body.get("groups", []))
    is_admin = body.get("admin", False)
    if not isinstance(is_admin, bool):
        raise BadRequestError("admin must be true or false")
    ttl = body.get("token_ttl")
    if ttl is not None and not isinstance(ttl, str):
        raise BadRequestError("token_ttl must be a duration such as 8h or 30d")
    user, token, expires_at = await create_user(
        context, admin, _confirmer(request, admin), name, groups, is_admin=is_admin, ttl=ttl
    )
    return json_response(
        {"user": _user_view(user), "token": token, "expires_at": timestamp(expires_at)},
        status=201,
    )


async def delete_user(request: web.Request) -> web.Response:
    admin = await require_admin(request)
    context = request.app[CONTEXT]
    name = request.match_info["user"]
    await context.store.delete_user(name)
    ended = await _access_changed(context, admin.name, "user.delete", name, user=name)
    return json_response({"deleted": name, "ended_requests": ended})


async def revoke_user_tokens(request: web.Request) -> web.Response:
    """Revoke every API token of a user (they fail at once on this server)."""
    admin = await require_admin(request)
    context = request.app[CONTEXT]
    name = request.match_info["user"]
    count, ended = await revoke_tokens(context, admin, name)
    return json_response({"user": name, "revoked": count, "ended_requests": ended})


async def new_user_token(request: web.Request) -> web.Response:
    admin = await require_admin(request)
    context = request.app[CONTEXT]
    name = request.match_info["user"]
    expires_at = _token_expiry(context, request.query.get("ttl"))
    await context.store.get_user(name)
    ended = 0
    if request.query.get("revoke_others") in ("1", "true"):
        await context.store.revoke_api_tokens(name)
        # At once, not after the new token is stored; live requests on the old ones end.
        ended = await _access_changed(context, admin.name, "user.revoke-tokens", name, user=name)
    token = await _issue_token(context, _confirmer(request, admin), name, expires_at)
    await context.audit.admin_action(admin.name, "user.token", name)
    return json_response(
        {
            "user": name,
            "token": token,
            "expires_at": timestamp(expires_at),
            "ended_requests": ended,
        },
        status=201,
    )


async def new_kubeconfig(request: web.Request) -> web.Response:
    """A kubeconfig for a cluster, carrying a new API token of the user."""
    caller = await authenticate(request)
    answer = await issue_kubeconfig(
        request.app[CONTEXT],
        caller,
        _confirmer(request, caller),
        hash_token(bearer_token(request)),
        name=request.match_info["user"],
        cluster=request.query.get("cluster", ""),
        ttl=request.query.get("ttl"),
    )
    return json_response(answer, status=201)


async def list_grants(request: web.Request) -> web.Response:
    await require_admin(request)
    store = request.app[CONTEXT].store
    grants = await store.list_grants(
        user=request.query.get("user") or None, cluster=request.query.get("cluster") or None
    )
    return json_response([_grant_view(grant) for grant in grants])


async def set_grant(request: web.Request) -> web.Response:
    admin = await require_admin(request)
    context = request.app[CONTEXT]
    user, cluster = request.match_info["user"], request.match_info["cluster"]
    body = await read_json(request)
    await context.store.get_user(user)
    await context.store.get_cluster(cluster)
    await confirm(request, admin)
    flags = {key: body.get(key, False) for key in ("commands", "impersonate", "commands_as_agent")}
    if not all(isinstance(value, bool) for value in flags.values()):
        raise BadRequestError("commands, impersonate and commands_as_agent must be true or false")
    if flags["commands_as_agent"] and not flags["commands"]:
        raise BadRequestError("commands_as_agent needs commands: true")
    targets = _impersonate_targets(body.get("impersonate_targets", []))
    if targets and not flags["impersonate"]:
        raise BadRequestError("impersonate_targets need impersonate: true")
    grant = Grant(
        user=user,
        cluster=cluster,
        as_groups=_groups(body.get("as_groups", [])),
        commands=flags["commands"],
        impersonate=flags["impersonate"],
        impersonate_targets=targets,
        commands_as_agent=flags["commands_as_agent"],
    )
    ended = await apply_grant(context, admin, grant)
    return json_response({**_grant_view(grant), "ended_requests": ended})


async def delete_grant(request: web.Request) -> web.Response:
    admin = await require_admin(request)
    context = request.app[CONTEXT]
    user, cluster = request.match_info["user"], request.match_info["cluster"]
    ended = await remove_grant(context, admin, user, cluster)
    return json_response({"deleted": {"user": user, "cluster": cluster}, "ended_requests": ended})


async def list_audit(request: web.Request) -> web.Response:
    await require_admin(request)
    query = request.query
    limit = _limit(query.get("limit", "100"))
    kind = query.get("kind") or None
    if kind not in (None, "proxy", "command", "admin"):
        raise BadRequestError("kind must be proxy, command or admin")
    await request.app[CONTEXT].audit.flush()
    events = await request.app[CONTEXT].store.list_audit(
        cluster=query.get("cluster") or None,
        user=query.get("user") or None,
        kind=kind,  # type: ignore[arg-type]
        limit=limit,
    )
    return json_response([audit_view(event) for event in events])


async def list_requests(request: web.Request) -> web.Response:
    """The proxied requests in progress (watches, exec, port-forwards ...), oldest first.

    Unlike the audit trail, which records a request when it ends, this shows
    what is open now: an exec session of three days is here from its start.
    """
    await require_admin(request)
    query = request.query
    limit = _limit(query.get("limit", "100"))
    cluster, user = query.get("cluster") or None, query.get("user") or None
    now, wall = time.monotonic(), time.time()
    views = [
        _request_view(exchange, now, wall)
        for exchange in request.app[CONTEXT].live.requests()
        if (cluster is None or exchange.cluster == cluster)
        and (user is None or exchange.user == user)
    ]
    return json_response(views[:limit])


def _limit(text: str) -> int:
    try:
        limit = int(text)
    except ValueError as exc:
        raise BadRequestError("limit must be a number") from exc
    return max(1, min(limit, 1000))


def _request_view(exchange: ProxyExchange, now: float, wall: float) -> dict[str, Any]:
    seconds = now - exchange.started
    return {
        "started": timestamp(datetime.fromtimestamp(wall - seconds, UTC)),
        "user": exchange.user,
        "cluster": exchange.cluster,
        "verb": exchange.verb,
        "path": exchange.path,
        "seconds": round(seconds, 3),
        "bytes_in": exchange.bytes_in,
        "bytes_out": exchange.bytes_out,
    }


def render_kubeconfig(context: ServerContext, cluster: str, user: str, token: str) -> str:
    """A kubeconfig pointing kubectl at the cluster through this server."""
    server = f"{context.settings.listen.public_url.rstrip('/')}/k8s/clusters/{cluster}"
    name = f"tunnel-{cluster}"
    config: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": name,
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(
                        context.identity.ca_bundle_pem
                    ).decode(),
                },
            }
        ],
        "users": [{"name": f"{name}-{user}", "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": f"{name}-{user}"}}],
        "current-context": name,
    }
    return yaml.safe_dump(config, sort_keys=False)


def _token_expiry(
    context: ServerContext, ttl: str | None, *, cap: datetime | None = None
) -> datetime | None:
    """When a new API token expires (None: never): after its ``ttl``, within the
    server's maximum, and not after ``cap``. Refuses a ``ttl`` it cannot use."""
    longest = context.settings.identity.max_api_token_ttl
    lifetime = longest if ttl is None else _lifetime(ttl, longest)
    expires_at = None if lifetime is None else utcnow() + lifetime
    if cap is not None and (expires_at is None or expires_at > cap):
        expires_at = cap
    return expires_at


def _lifetime(ttl: str, longest: timedelta | None) -> timedelta:
    shown = ttl[:32]
    try:
        lifetime = parse_duration(ttl)
    except FlagError as exc:
        raise BadRequestError(f"ttl: {exc}") from exc
    if lifetime < MIN_API_TOKEN_TTL:
        raise BadRequestError(
            f"ttl must be at least {describe_duration(MIN_API_TOKEN_TTL)}, not {shown}"
        )
    if longest is not None and lifetime > longest:
        raise BadRequestError(
            f"ttl must be at most {describe_duration(longest)} on this server "
            f"(--max-api-token-ttl), not {shown}"
        )
    if lifetime > MAX_API_TOKEN_TTL:
        raise BadRequestError(
            f"ttl must be at most {describe_duration(MAX_API_TOKEN_TTL)}, not {shown}"
        )
    return lifetime


async def _expiry_of_callers_token(
    context: ServerContext, caller: User, token_hash: str
) -> datetime | None:
    """When the caller's API token with this hash expires (None: never); 401 if it is gone."""
    for token in await context.store.list_api_tokens(caller.name):
        if token.token_hash == token_hash:
            return token.expires_at
    # Revoked since the request came: its absence must not read as "never expires".
    raise invalid_token()


async def _issue_token(
    context: ServerContext, recheck: Recheck, user: str, expires_at: datetime | None
) -> str:
    """A new API token of ``user``, refused from ``expires_at`` on (None: never).

    Made on a caller's word, which ``recheck`` checks again after the token is
    stored: a token minted while the caller's was being revoked goes with it.
    """
    token = new_token("tat")
    token_hash = hash_token(token)
    await context.store.add_api_token(token_hash, user, utcnow(), expires_at)
    context.access.invalidate()
    try:
        await recheck()
    except ApiError:
        await context.store.delete_api_token(token_hash)  # never handed out, never cached
        raise
    return token


async def _access_changed(
    context: ServerContext,
    admin: str,
    verb: str,
    target: str,
    *,
    user: str,
    cluster: str | None = None,
) -> int:
    """After a change of a user's tokens or grants in the store; the requests it ended.

    New requests are refused at once (the access cache is cleared before any
    await), the admin's change is audited, and only then are the user's
    requests in progress (on ``cluster``, if given) checked again: that may
    take a while, or be cancelled with the API call.
    """
    context.access.invalidate()
    await context.audit.admin_action(admin, verb, target, cluster)
    return await context.live.access_changed(user=user, cluster=cluster)


def _groups(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) > _MAX_GROUPS:
        raise BadRequestError(f"groups must be a list of at most {_MAX_GROUPS} names")
    return tuple(validate_principal(str(group), "group") for group in value)


def _impersonate_targets(value: Any) -> tuple[str, ...]:
    """Whom an impersonate grant allows: user names, and ``group:NAME`` for groups."""
    if not isinstance(value, list) or len(value) > _MAX_IMPERSONATE_TARGETS:
        raise BadRequestError(
            f"impersonate_targets must be a list of at most {_MAX_IMPERSONATE_TARGETS} "
            "user names and group:NAME entries"
        )
    targets = []
    for target in value:
        if not isinstance(target, str):
            raise BadRequestError("impersonate_targets must be user names and group:NAME entries")
        if target.startswith(GROUP_TARGET):
            validate_principal(target[len(GROUP_TARGET) :], "group")
        else:
            validate_principal(target, "user name")
        targets.append(target)
    return tuple(dict.fromkeys(targets))


def _user_view(user: User) -> dict[str, Any]:
    return {
        "name": user.name,
        "groups": list(user.groups),
        "admin": user.is_admin,
        "identity": IDENTITY_PREFIX + user.name,
        "created_at": timestamp(user.created_at),
    }


def _grant_view(grant: Grant) -> dict[str, Any]:
    return {
        "user": grant.user,
        "cluster": grant.cluster,
        "as_groups": list(grant.as_groups),
        "commands": grant.commands,
        "impersonate": grant.impersonate,
        # Empty with impersonate: anyone under tunnel:.
        "impersonate_targets": list(grant.impersonate_targets),
        # Commands act as the agent, not as tunnel:<user>.
        "commands_as_agent": grant.commands_as_agent,
    }


def audit_view(event: AuditEvent) -> dict[str, Any]:
    """An audit event as the API (and the console's export) shows it."""
    return {
        "id": event.id,
        "time": timestamp(event.time),
        "user": event.user,
        "cluster": event.cluster,
        "kind": event.kind,
        "verb": event.verb,
        "path": event.path,
        "status": event.status,
        "bytes_in": event.bytes_in,
        "bytes_out": event.bytes_out,
        "duration_ms": event.duration_ms,
        "detail": event.detail,
    }


# --- Actions the REST API and the console share -------------------------------------
#
# The REST handlers above read a request and call these; the console
# (tunnel_server/console/) calls the same, so that one place decides what an
# action needs and what it records. Who may act is checked by the caller
# (require_admin, or the console's session); ``recheck`` checks that caller again
# just before a change is made on its word.

Recheck = Callable[[], Awaitable[None]]
"""Checks the caller again (a token revoked, an admin demoted meanwhile), raising ApiError."""


def _confirmer(request: web.Request, caller: User) -> Recheck:
    """The REST API's :data:`Recheck`: the request's bearer token, asked afresh."""

    async def recheck() -> None:
        await confirm(request, caller)

    return recheck


async def create_user(
    context: ServerContext,
    admin: User,
    recheck: Recheck,
    name: str,
    groups: tuple[str, ...],
    *,
    is_admin: bool,
    ttl: str | None,
) -> tuple[User, str, datetime | None]:
    """Add a user with a first API token (``ttl``: its lifetime, None for the longest);
    return the user, the token and when it expires. Audited as ``user.add``."""
    name = validate_principal(name, "user name")
    expires_at = _token_expiry(context, ttl)
    await recheck()
    user = await context.store.add_user(name, groups, is_admin, utcnow())
    token = await _issue_token(context, recheck, name, expires_at)
    await context.audit.admin_action(admin.name, "user.add", name)
    return user, token, expires_at


async def revoke_tokens(context: ServerContext, admin: User, name: str) -> tuple[int, int]:
    """Revoke every API token of user ``name``; (tokens revoked, live requests ended).
    Audited as ``user.revoke-tokens``."""
    await context.store.get_user(name)
    count = await context.store.revoke_api_tokens(name)
    ended = await _access_changed(context, admin.name, "user.revoke-tokens", name, user=name)
    return count, ended


async def remove_grant(context: ServerContext, admin: User, user: str, cluster: str) -> int:
    """Remove ``user``'s grant on ``cluster``; the live requests it ended. Audited as
    ``ungrant``."""
    await context.store.delete_grant(user, cluster)
    target = f"{user}@{cluster}"
    return await _access_changed(context, admin.name, "ungrant", target, user=user, cluster=cluster)


async def apply_grant(context: ServerContext, admin: User, grant: Grant) -> int:
    """Create or replace a grant; the live requests the change ended. Audited as ``grant``
    (and ``grant.commands-as-agent`` for a grant whose commands act as the agent)."""
    await context.store.set_grant(grant)
    if grant.commands_as_agent:
        # On the record by name: this user's commands act with the agent's identity.
        await context.audit.admin_action(
            admin.name, "grant.commands-as-agent", f"{grant.user}@{grant.cluster}", grant.cluster
        )
    # A changed grant may change the identity the cluster sees: requests made as the old one end.
    target = f"{grant.user}@{grant.cluster}"
    return await _access_changed(
        context, admin.name, "grant", target, user=grant.user, cluster=grant.cluster
    )


async def issue_kubeconfig(
    context: ServerContext,
    caller: User,
    recheck: Recheck,
    caller_token_hash: str,
    *,
    name: str,
    cluster: str,
    ttl: str | None,
) -> dict[str, Any]:
    """A kubeconfig of user ``name`` for ``cluster``, with a new API token of theirs.

    An admin may make one for anyone; a user only for themselves, on a cluster
    they have a grant on, with a token that lives no longer than the caller's
    (the one with ``caller_token_hash``). Audited as ``kubeconfig``.
    """
    if name != caller.name and not caller.is_admin:
        raise ForbiddenError("only an admin can make a kubeconfig for another user")
    # A user's own token lives no longer than the one that asked for it: an
    # expiring token cannot be traded for one that lives on.
    cap = (
        None
        if caller.is_admin
        else await _expiry_of_callers_token(context, caller, caller_token_hash)
    )
    expires_at = _token_expiry(context, ttl, cap=cap)
    # A non-admin asks for itself (above): the grant it needs is the one the kubeconfig uses.
    grant = await context.access.grant(name, cluster)
    if not caller.is_admin and grant is None:
        # Which clusters exist is for admins to know: without a grant, one answer for all.
        raise ForbiddenError(
            f"user {caller.name} has no grant on cluster {cluster[:63]!r}", code="not_granted"
        )
    await context.store.get_cluster(cluster)
    user = await context.store.get_user(name)
    token = await _issue_token(context, recheck, user.name, expires_at)
    await context.audit.admin_action(caller.name, "kubeconfig", f"{name}@{cluster}")
    return {
        "kubeconfig": render_kubeconfig(context, cluster, user.name, token),
        "granted": grant is not None,
        "expires_at": timestamp(expires_at),
    }
