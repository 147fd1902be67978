"""The headers every console answer carries: a strict Content-Security-Policy and friends.

No inline script or style is allowed, nor anything from another origin: the
pages' scripts and styles are the server's own static files. Pages may not be
framed (clickjacking), nor cached, nor tell other sites where the user was (the
referrer goes to this origin only, whose forms' Origin header ``sessions`` checks).
"""

from __future__ import annotations

from aiohttp import web

__all__ = ["CONTENT_SECURITY_POLICY", "PREFIX", "security_headers"]

PREFIX = "/ui/"

CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
    )
)

_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}


async def security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Set the console's headers on each of its answers (an ``on_response_prepare`` hook)."""
    if not (request.path == PREFIX.rstrip("/") or request.path.startswith(PREFIX)):
        return
    for name, value in _HEADERS.items():
        response.headers[name] = value
    if not request.path.startswith(PREFIX + "static/"):
        # Pages show who may see what: never kept by a browser or a proxy.
        response.headers["Cache-Control"] = "no-store"
