"""Who is signed in: a session id in a cookie, the session itself in the store.

Signing in trades an API token, pasted once into the sign-in form, for a
random session id. The browser keeps only that id, in a cookie it never shows
to scripts (``HttpOnly``), sends only over TLS (``Secure``, and the ``__Host-``
prefix: this host, path ``/``) and never with a request another site started
(``SameSite=Strict``). The store keeps its SHA-256 hash, with the user and the
hash of the token, so any replica sharing the store knows the session, and a
session ends with its token (revoked, expired, its user deleted) as well as at
its own expiry or at sign-out. The token itself is kept nowhere.

Every state-changing request also carries a CSRF token: a digest of the session
id, which another site cannot know; before sign-in, the sign-in form's own
token is checked against a cookie of its own (double submit).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from dataclasses import dataclass
from datetime import datetime

from aiohttp import web

from tunnel_server.access.auth import MAX_TOKEN_LENGTH
from tunnel_server.clock import utcnow
from tunnel_server.console.state import CONSOLE
from tunnel_server.context import CONTEXT
from tunnel_server.errors import ForbiddenError, TooManyRequestsError, UnauthorizedError
from tunnel_server.store.base import NotFoundError, User, hash_token
from tunnel_server.store.console import ConsoleSession

__all__ = [
    "COOKIE",
    "PRE_COOKIE",
    "Viewer",
    "check_csrf",
    "current_viewer",
    "end_session",
    "sign_in",
    "signed_out_cookies",
]

logger = logging.getLogger(__name__)

#: The session cookie; ``__Host-``: Secure, path /, no Domain (browsers enforce it).
COOKIE = "__Host-tunnel-console"
#: The sign-in form's double-submit cookie, before there is a session.
PRE_COOKIE = "__Host-tunnel-console-signin"
_ID_LENGTH = 43  # secrets.token_urlsafe(32)
#: The request's viewer, once asked (None: not signed in).
_VIEWER: web.RequestKey[Viewer | None] = web.RequestKey("console_viewer")


@dataclass(frozen=True, slots=True)
class Viewer:
    """The signed-in user of a request, and their session."""

    user: User
    session: ConsoleSession
    #: The CSRF token every form of this session carries.
    csrf: str

    @property
    def name(self) -> str:
        return self.user.name

    @property
    def is_admin(self) -> bool:
        return self.user.is_admin


def csrf_token(session_id: str) -> str:
    """The CSRF token of a session: derived from its id, which only its browser knows."""
    return hashlib.sha256(b"tunnel-console-csrf:" + session_id.encode()).hexdigest()


def _session_id(request: web.Request) -> str | None:
    value = request.cookies.get(COOKIE, "")
    if len(value) != _ID_LENGTH or not value.isascii():
        return None
    return value


async def current_viewer(request: web.Request) -> Viewer | None:
    """The signed-in user of ``request``, or None (no session, or it ended)."""
    if _VIEWER in request:
        return request[_VIEWER]
    found = None
    session_id = _session_id(request)
    if session_id is not None:
        found = await _viewer(request.app, session_id)
    request[_VIEWER] = found
    return found


async def _viewer(app: web.Application, session_id: str) -> Viewer | None:
    context = app[CONTEXT]
    session = await context.store.get_console_session(hash_token(session_id), utcnow())
    if session is None:
        return None
    # The token it was made with still names its user: one check for tokens and sessions.
    _, user = await context.access.lookup_user_by_hash(session.token_hash)
    if user is None or user.name != session.user:
        return None
    return Viewer(user=user, session=session, csrf=csrf_token(session_id))


async def still_signed_in(app: web.Application, viewer: Viewer) -> Viewer | None:
    """``viewer`` checked afresh (a live page asks again now and then), or None."""
    context = app[CONTEXT]
    session = await context.store.get_console_session(viewer.session.session_hash, utcnow())
    if session is None:
        return None
    _, user = await context.access.lookup_user_by_hash(session.token_hash)
    if user is None or user.name != session.user:
        return None
    return Viewer(user=user, session=session, csrf=viewer.csrf)


def check_csrf(request: web.Request, viewer: Viewer | None, submitted: str) -> None:
    """Refuse (403) a state-changing request without the right CSRF token.

    With a session, the token is the session's; before sign-in, the sign-in
    form's cookie. A request another site started also fails the Origin check
    when the browser says where it came from.
    """
    origin = request.headers.get("Origin")
    # The server speaks TLS only (the listener's, so aiohttp's own scheme says http).
    if origin is not None and origin != f"https://{request.host}":
        raise ForbiddenError("this form was sent from another site", code="csrf")
    expected = viewer.csrf if viewer is not None else request.cookies.get(PRE_COOKIE, "")
    if not expected or not hmac.compare_digest(expected.encode(), submitted.encode()):
        raise ForbiddenError(
            "the form's CSRF token is missing or wrong: reload the page and try again",
            code="csrf",
        )


def new_pre_token() -> str:
    """A fresh double-submit token for the sign-in form."""
    return secrets.token_urlsafe(32)


async def sign_in(request: web.Request, token: str) -> tuple[str, datetime]:
    """Trade an API token for a new session; its id and expiry. 401 or 429 otherwise.

    Failures count against the client's address (:mod:`ratelimit`); the token
    is never logged nor kept, only the hash the store has of it already.
    """
    console = request.app[CONSOLE]
    context = request.app[CONTEXT]
    address = request.remote or "unknown"
    wait = console.failures.wait(address)
    if wait > 0:
        logger.warning("console sign-in from %s refused: too many failures", address)
        raise TooManyRequestsError(
            "too many failed sign-ins from this address; try again later",
            retry_after=wait,
            code="sign_in_limited",
        )
    token = token.strip()
    user = None
    if 0 < len(token) <= MAX_TOKEN_LENGTH and token.isascii() and token.isprintable():
        user = await context.access.user_for_token(token)
    if user is None:
        console.failures.failed(address)
        logger.info("console sign-in from %s failed: the token is not valid", address)
        raise UnauthorizedError(
            "that API token is not valid (unknown, expired or revoked)", code="token_invalid"
        )
    token_hash = hash_token(token)
    now = utcnow()
    expires_at = now + console.session_ttl
    for held in await context.store.list_api_tokens(user.name):
        if held.token_hash == token_hash and held.expires_at is not None:
            expires_at = min(expires_at, held.expires_at)
    session_id = secrets.token_urlsafe(32)
    try:
        await context.store.add_console_session(
            ConsoleSession(hash_token(session_id), user.name, token_hash, now, expires_at)
        )
    except NotFoundError as exc:  # revoked between the two questions
        raise UnauthorizedError("that API token is not valid", code="token_invalid") from exc
    # Who and from where; never the token nor the session id.
    logger.info("console sign-in by %s from %s", user.name, address)
    return session_id, expires_at


async def end_session(request: web.Request, viewer: Viewer) -> None:
    """Sign out: the session ends in the store, for every replica."""
    await request.app[CONTEXT].store.delete_console_session(viewer.session.session_hash)


def set_session_cookie(response: web.StreamResponse, session_id: str, seconds: int) -> None:
    response.set_cookie(
        COOKIE,
        session_id,
        max_age=max(1, seconds),
        path="/",
        secure=True,
        httponly=True,
        samesite="Strict",
    )
    response.del_cookie(PRE_COOKIE, path="/", secure=True, httponly=True, samesite="Strict")


def set_pre_cookie(response: web.StreamResponse, token: str) -> None:
    response.set_cookie(
        PRE_COOKIE, token, max_age=3600, path="/", secure=True, httponly=True, samesite="Strict"
    )


def signed_out_cookies(response: web.StreamResponse) -> None:
    """Make the browser forget its session cookie."""
    response.del_cookie(COOKIE, path="/", secure=True, httponly=True, samesite="Strict")
