"""The console's routes under ``/ui/``, and what it keeps for the application's life."""

from __future__ import annotations

from aiohttp import web

from tunnel_server.console import actions, events, pages
from tunnel_server.console.headers import security_headers
from tunnel_server.console.render import STATIC_DIR, make_templates
from tunnel_server.console.state import CONSOLE, ConsoleState

__all__ = ["setup_console"]


async def _to_console(request: web.Request) -> web.StreamResponse:
    raise web.HTTPSeeOther("/ui/")


def setup_console(app: web.Application) -> None:
    """Serve the console under ``/ui/`` on ``app`` (the server's one port)."""
    app[CONSOLE] = ConsoleState(templates=make_templates())
    app.on_response_prepare.append(security_headers)
    router = app.router
    router.add_get("/ui", _to_console)
    router.add_get("/ui/", pages.fleet_page)
    router.add_get("/ui/sign-in", actions.sign_in_form)
    router.add_post("/ui/sign-in", actions.sign_in_submit)
    router.add_post("/ui/sign-out", actions.sign_out)
    router.add_get("/ui/clusters/{cluster}", pages.cluster_page)
    router.add_post("/ui/clusters/{cluster}/kubeconfig", actions.download_kubeconfig)
    router.add_post("/ui/clusters/{cluster}/end-request", actions.end_request)
    router.add_get("/ui/commands", pages.commands_page)
    router.add_get("/ui/commands/{id}", pages.command_page)
    router.add_post("/ui/commands/{id}/cancel", actions.cancel_command)
    router.add_get("/ui/audit", pages.audit_page)
    router.add_get("/ui/audit/export", pages.audit_export)
    router.add_get("/ui/users", pages.users_page)
    router.add_post("/ui/users", actions.add_user)
    router.add_post("/ui/users/{user}/revoke-tokens", actions.revoke_user_tokens)
    router.add_post("/ui/grants", actions.grant)
    router.add_post("/ui/grants/remove", actions.ungrant)
    router.add_get("/ui/events/fleet", events.fleet_events)
    router.add_get("/ui/events/commands/{id}", events.command_events)
    router.add_static("/ui/static/", STATIC_DIR, append_version=False)
