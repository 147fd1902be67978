"""How every console handler starts: who is signed in, and errors as pages.

A page without a session sends the browser to the sign-in form; an action (a
POST) also needs the form's CSRF token. An error is shown as a page with its
status, in the words the REST API would use.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from multidict import MultiDict, MultiDictProxy

from tunnel_server.console.render import page
from tunnel_server.console.sessions import Viewer, check_csrf, current_viewer
from tunnel_server.errors import ApiError, NotFoundApiError, UnavailableError
from tunnel_server.store.base import NotFoundError, StoreError

__all__ = ["SIGN_IN", "Action", "Page", "action", "form_of", "guarded"]

logger = logging.getLogger(__name__)

SIGN_IN = "/ui/sign-in"

Page = Callable[[web.Request, Viewer], Awaitable[web.StreamResponse]]
Action = Callable[[web.Request, Viewer, MultiDictProxy[str]], Awaitable[web.StreamResponse]]

_FORM: web.RequestKey[MultiDictProxy[str]] = web.RequestKey("console_form")


def guarded(handler: Page) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """A page handler for signed-in users; others are sent to sign in."""

    @functools.wraps(handler)
    async def run(request: web.Request) -> web.StreamResponse:
        viewer = await current_viewer(request)
        if viewer is None:
            raise web.HTTPSeeOther(SIGN_IN)
        try:
            return await handler(request, viewer)
        except ApiError as exc:
            return error_page(request, viewer, exc)
        except NotFoundError as exc:
            return error_page(request, viewer, NotFoundApiError(str(exc)))
        except StoreError as exc:
            logger.error("store failure: %s", exc)
            return error_page(
                request, viewer, UnavailableError("the server's store is unavailable")
            )

    return run


def action(handler: Action) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """A state-changing handler (POST): signed in, and the form's CSRF token checked."""

    async def checked(request: web.Request, viewer: Viewer) -> web.StreamResponse:
        form = await form_of(request)
        check_csrf(request, viewer, form.get("csrf", ""))
        return await handler(request, viewer, form)

    functools.update_wrapper(checked, handler)
    return guarded(checked)


async def form_of(request: web.Request) -> MultiDictProxy[str]:
    """The request's form fields, text only (no file is taken)."""
    if _FORM not in request:
        kept: MultiDict[str] = MultiDict()
        for key, value in (await request.post()).items():
            if isinstance(value, str):
                kept.add(key, value)
        request[_FORM] = MultiDictProxy(kept)
    return request[_FORM]


def error_page(request: web.Request, viewer: Viewer | None, error: ApiError) -> web.Response:
    response = page(request, "error.html", viewer, status=error.status, error=error)
    if error.retry_after is not None:
        response.headers["Retry-After"] = str(max(1, round(error.retry_after)))
    return response
