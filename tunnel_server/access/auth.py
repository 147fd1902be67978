"""Who is calling: bearer API tokens, checked against their stored hashes."""

from __future__ import annotations

from aiohttp import web

from tunnel_server.context import CONTEXT
from tunnel_server.errors import ForbiddenError, UnauthorizedError
from tunnel_server.store.base import User

__all__ = [
    "MAX_TOKEN_LENGTH",
    "authenticate",
    "bearer_token",
    "confirm",
    "invalid_token",
    "parse_bearer",
    "require_admin",
]

MAX_TOKEN_LENGTH = 256


def bearer_token(request: web.Request) -> str:
    """The bearer token of the request, bounded and well-formed, or 401."""
    return parse_bearer(request.headers.get("Authorization", ""))


def parse_bearer(header: str) -> str:
    """The token of an ``Authorization: Bearer TOKEN`` value, or 401."""
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise UnauthorizedError(
            "send an API token as 'Authorization: Bearer TOKEN' "
            "(tunnelctl reads it from --token-file or TUNNELCTL_TOKEN)",
            code="token_missing",
        )
    if len(token) > MAX_TOKEN_LENGTH or not token.isascii() or not token.isprintable():
        raise UnauthorizedError("the API token is not valid", code="token_invalid")
    return token


def invalid_token() -> UnauthorizedError:
    """The 401 for a well-formed token that is not (or no longer) any user's."""
    return UnauthorizedError(
        "the API token is not valid (unknown, expired or revoked)", code="token_invalid"
    )


async def authenticate(request: web.Request) -> User:
    """The user whose API token the request carries, or 401."""
    token = bearer_token(request)
    user = await request.app[CONTEXT].access.user_for_token(token)
    if user is None:
        raise invalid_token()
    return user


async def require_admin(request: web.Request) -> User:
    """The calling user, who must be an admin, or 401/403."""
    user = await authenticate(request)
    if not user.is_admin:
        raise ForbiddenError(f"user {user.name} is not an admin", code="admin_required")
    return user


async def confirm(request: web.Request, caller: User) -> None:
    """Check the caller again just before a change is made on its word; 401/403 if it lapsed.

    A handler checks the caller when the request head comes, then reads the
    body (for up to ``httpjson.BODY_TIMEOUT``) or asks the store: a token
    revoked, a user deleted or an admin demoted meanwhile must not act after
    all. A revocation clears the access cache, so this asks afresh.
    """
    again = await authenticate(request)
    if again.name != caller.name:
        raise invalid_token()
    if caller.is_admin and not again.is_admin:
        raise ForbiddenError(f"user {again.name} is not an admin", code="admin_required")
