"""The console's actions (POST): sign in and out, and what an operator changes.

Every action but signing in needs a session and its CSRF token (``guard``).
The changes an admin makes (users, grants, tokens) ask for confirmation first,
then call the very functions the REST API calls (:mod:`tunnel_server.api.users`),
so they are checked, applied and audited exactly as their ``tunnelctl`` twins.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web
from multidict import MultiDictProxy

from protocol.kinds import HTTP_ACCESS_REVOKED
from tunnel_server.api.users import (
    apply_grant,
    create_user,
    issue_kubeconfig,
    remove_grant,
    revoke_tokens,
)
from tunnel_server.clock import utcnow
from tunnel_server.console.guard import SIGN_IN, action, form_of
from tunnel_server.console.render import page
from tunnel_server.console.sessions import (
    Viewer,
    check_csrf,
    current_viewer,
    end_session,
    new_pre_token,
    set_pre_cookie,
    set_session_cookie,
    sign_in,
    signed_out_cookies,
    still_signed_in,
)
from tunnel_server.console.visibility import (
    require_admin_viewer,
    visible_cluster,
    visible_command,
)
from tunnel_server.context import CONTEXT
from tunnel_server.errors import ApiError, NotFoundApiError, UnauthorizedError
from tunnel_server.store.base import Grant

__all__ = [
    "add_user",
    "cancel_command",
    "download_kubeconfig",
    "end_request",
    "grant",
    "revoke_user_tokens",
    "sign_in_form",
    "sign_in_submit",
    "sign_out",
    "ungrant",
]

logger = logging.getLogger(__name__)


async def sign_in_form(request: web.Request) -> web.StreamResponse:
    """The sign-in form (a signed-in user goes to the fleet)."""
    if await current_viewer(request) is not None:
        raise web.HTTPSeeOther("/ui/")
    return _sign_in_page(request)


def _sign_in_page(
    request: web.Request, error: ApiError | None = None, status: int = 200
) -> web.Response:
    pre = new_pre_token()
    response = page(request, "sign_in.html", None, status=status, csrf=pre, error=error)
    set_pre_cookie(response, pre)
    if error is not None and error.retry_after is not None:
        response.headers["Retry-After"] = str(max(1, round(error.retry_after)))
    return response


async def sign_in_submit(request: web.Request) -> web.StreamResponse:
    """Trade the pasted API token for a session cookie; back to the form on failure."""
    form = await form_of(request)
    try:
        check_csrf(request, None, form.get("csrf", ""))
        session_id, expires_at = await sign_in(request, form.get("token", ""))
    except ApiError as exc:
        return _sign_in_page(request, exc, exc.status)
    response = see_other("/ui/")
    seconds = int((expires_at - utcnow()).total_seconds())
    set_session_cookie(response, session_id, seconds)
    return response


async def sign_out(request: web.Request) -> web.StreamResponse:
    """End the session on the server, and forget its cookie."""
    viewer = await current_viewer(request)
    form = await form_of(request)
    if viewer is not None:
        check_csrf(request, viewer, form.get("csrf", ""))
        await end_session(request, viewer)
    response = see_other(SIGN_IN)
    signed_out_cookies(response)
    return response


def see_other(location: str) -> web.Response:
    """Send the browser to ``location`` (after a POST: a GET there)."""
    return web.Response(status=303, headers={"Location": location})


def _recheck(request: web.Request, viewer: Viewer) -> Callable[[], Awaitable[None]]:
    """The console's ``Recheck``: the session, and whether its user is still who acts."""

    async def recheck() -> None:
        again = await still_signed_in(request.app, viewer)
        if again is None:
            raise UnauthorizedError("your session ended; sign in again", code="session_ended")
        if viewer.is_admin and not again.is_admin:
            raise UnauthorizedError(f"user {again.name} is no longer an admin")

    return recheck


def _confirm(
    request: web.Request,
    viewer: Viewer,
    form: MultiDictProxy[str],
    question: str,
    fields: Mapping[str, str],
    back: str,
) -> web.Response | None:
    """The confirmation page for an action, unless the form says it was confirmed."""
    if form.get("confirmed") == "yes":
        return None
    return page(
        request,
        "confirm.html",
        viewer,
        question=question,
        action=request.path,
        fields=dict(fields),
        back=back,
    )


@action
async def add_user(
    request: web.Request, viewer: Viewer, form: MultiDictProxy[str]
) -> web.StreamResponse:
    """``tunnelctl user add``: a new user and their first token, shown once."""
    require_admin_viewer(viewer.user)
    name = form.get("name", "").strip()
    groups = tuple(g.strip() for g in form.get("groups", "").split(",") if g.strip())
    is_admin = form.get("admin") == "yes"
    ttl = form.get("ttl", "").strip() or None
    fields = {"name": name, "groups": ",".join(groups), "ttl": ttl or ""}
    if is_admin:
        fields["admin"] = "yes"
    question = f"Add user {name}{' as an admin' if is_admin else ''}?"
    asked = _confirm(request, viewer, form, question, fields, "/ui/users")
    if asked is not None:
        return asked
    context = request.app[CONTEXT]
    user, token, expires_at = await create_user(
        context, viewer.user, _recheck(request, viewer), name, groups, is_admin=is_admin, ttl=ttl
    )
    return page(request, "user_added.html", viewer, user=user, token=token, expires_at=expires_at)


@action
async def revoke_user_tokens(
    request: web.Request, viewer: Viewer, form: MultiDictProxy[str]
) -> web.StreamResponse:
    """``tunnelctl user revoke-tokens``: every API token of a user, and their sessions."""
    require_admin_viewer(viewer.user)
    name = request.match_info["user"]
    question = f"Revoke every API token of {name}? Their requests in progress end."
    asked = _confirm(request, viewer, form, question, {}, "/ui/users")
    if asked is not None:
        return asked
    await _recheck(request, viewer)()
    count, ended = await revoke_tokens(request.app[CONTEXT], viewer.user, name)
    return page(
        request,
        "done.html",
        viewer,
        message=f"Revoked {count} token(s) of {name}; {ended} request(s) in progress ended.",
        back="/ui/users",
    )


@action
async def grant(
    request: web.Request, viewer: Viewer, form: MultiDictProxy[str]
) -> web.StreamResponse:
    """``tunnelctl grant USER --cluster C [--commands]``."""
    require_admin_viewer(viewer.user)
    context = request.app[CONTEXT]
    user, cluster = form.get("user", ""), form.get("cluster", "")
    commands = form.get("commands") == "yes"
    await context.store.get_user(user)
    await context.store.get_cluster(cluster)
    fields = {"user": user, "cluster": cluster}
    if commands:
        fields["commands"] = "yes"
    question = f"Grant {user} access to {cluster}{' with commands' if commands else ''}?"
    asked = _confirm(request, viewer, form, question, fields, "/ui/users")
    if asked is not None:
        return asked
    await _recheck(request, viewer)()
    ended = await apply_grant(
        context, viewer.user, Grant(user=user, cluster=cluster, commands=commands)
    )
    message = f"Granted {user} access to {cluster}."
    if ended:
        message += f" {ended} request(s) made under the old grant ended."
    return page(request, "done.html", viewer, message=message, back="/ui/users")


@action
async def ungrant(
    request: web.Request, viewer: Viewer, form: MultiDictProxy[str]
) -> web.StreamResponse:
    """``tunnelctl ungrant USER --cluster C``: also ends their requests there."""
    require_admin_viewer(viewer.user)
    user, cluster = form.get("user", ""), form.get("cluster", "")
    question = f"Take {user}'s access to {cluster} away? Their requests there end."
    asked = _confirm(
        request, viewer, form, question, {"user": user, "cluster": cluster}, "/ui/users"
    )
    if asked is not None:
        return asked
    await _recheck(request, viewer)()
    ended = await remove_grant(request.app[CONTEXT], viewer.user, user, cluster)
    return page(
        request,
        "done.html",
        viewer,
        message=f"{user} no longer has access to {cluster}; {ended} request(s) ended.",
        back="/ui/users",
    )


@action
async def download_kubeconfig(
    request: web.Request, viewer: Viewer, form: MultiDictProxy[str]
) -> web.StreamResponse:
    """A kubeconfig of the signed-in user for a cluster, with a new short-lived token."""
    context = request.app[CONTEXT]
    cluster = await visible_cluster(context, viewer.user, request.match_info["cluster"])
    ttl = form.get("ttl", "").strip() or None
    answer = await issue_kubeconfig(
        context,
        viewer.user,
        _recheck(request, viewer),
        viewer.session.token_hash,
        name=viewer.name,
        cluster=cluster.name,
        ttl=ttl,
    )
    return web.Response(
        text=answer["kubeconfig"],
        content_type="application/yaml",
        charset="utf-8",
        headers={
            "Content-Disposition": f'attachment; filename="{cluster.name}-{viewer.name}.yaml"'
        },
    )


@action
async def end_request(
    request: web.Request, viewer: Viewer, form: MultiDictProxy[str]
) -> web.StreamResponse:
    """An admin ends one request in progress on this replica (its stream is reset)."""
    require_admin_viewer(viewer.user)
    context = request.app[CONTEXT]
    cluster = await visible_cluster(context, viewer.user, request.match_info["cluster"])
    back = f"/ui/clusters/{cluster.name}"
    stream_id = form.get("stream", "")
    found = [
        exchange
        for exchange in context.live.requests()
        if exchange.cluster == cluster.name
        and exchange.stream is not None
        and str(exchange.stream.id) == stream_id
    ]
    if not found:
        raise NotFoundApiError("that request is no longer in progress on this server")
    exchange = found[0]
    question = f"End {exchange.user}'s {exchange.verb} of {exchange.path}?"
    asked = _confirm(request, viewer, form, question, {"stream": stream_id}, back)
    if asked is not None:
        return asked
    if exchange.stream is not None and exchange.stream.error is None:
        # As a revocation ends one: the caller is told why, the agent ends it upstream.
        exchange.stream.reset(HTTP_ACCESS_REVOKED, f"ended by {viewer.name} in the console")
        logger.warning(
            "request ended by %s in the console", viewer.name, extra={"cluster": cluster.name}
        )
        await context.audit.admin_action(
            viewer.name, "request.end", f"{exchange.user}@{cluster.name}", cluster.name
        )
    return page(request, "done.html", viewer, message="The request was ended.", back=back)


@action
async def cancel_command(
    request: web.Request, viewer: Viewer, form: MultiDictProxy[str]
) -> web.StreamResponse:
    """``tunnelctl commands cancel ID``."""
    context = request.app[CONTEXT]
    record = await visible_command(context, viewer.user, request.match_info["id"])
    back = f"/ui/commands/{record.id}"
    asked = _confirm(request, viewer, form, f"Cancel command {record.name}?", {}, back)
    if asked is not None:
        return asked
    if not record.finished:
        await _recheck(request, viewer)()
        await context.commands.cancel(record.id, viewer.name)
    raise web.HTTPSeeOther(back)
