"""The agent's own rules for relayed requests.

The cluster owner trusts the agent, not the server; so the agent checks every
request before it reaches the API server, whatever the server allowed: only
the API server as target (paths, never host:port), only ``tunnel:``
identities, and optionally read-only, a namespace scope, and no Secret values.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from protocol.http import Headers, RequestHead
from tunnel_kube import ApiRequest, parse_api_request

__all__ = ["IDENTITY_PREFIX", "ProxyPolicy", "Refusal"]

IDENTITY_PREFIX = "tunnel:"

#: Requests that only ask the API server about the caller itself.
_SELF_REVIEWS = frozenset(
    {"selfsubjectaccessreviews", "selfsubjectrulesreviews", "selfsubjectreviews"}
)


@dataclass(frozen=True, slots=True, init=False)
class Refusal:
    """Why the agent refuses a request: an HTTP status and a message."""

    status: int
    reason: str
    message: str

    def __init__(self, status: int, reason: str, message: str) -> None:
        object.__setattr__(self, "status", status)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "message", message)


@dataclass(frozen=True, slots=True)
class ProxyPolicy:
    read_only: bool = False
    #: Namespaces requests may touch; empty means all.
    namespaces: frozenset[str] = frozenset()
    allow_secret_values: bool = False

    def check(self, head: RequestHead) -> Refusal | None:
        """None when the request may go on; otherwise why not."""
        refusal = _identity_refusal(head.headers)
        if refusal is not None:
            return refusal
        request = parse_api_request(head.method, head.path)
        self_review = request.resource in _SELF_REVIEWS and request.verb == "create"
        if self.read_only and not (request.is_read or self_review):
            what = request.subresource or request.verb
            return _forbidden(f"this agent is read-only: {what} is not allowed")
        scoped = self.namespaces and request.is_resource and not self_review
        if scoped and request.namespace not in self.namespaces:
            scope = ", ".join(sorted(self.namespaces))
            where = request.namespace or "cluster-wide"
            return _forbidden(f"this agent serves namespaces {scope} only, not {where} requests")
        if _reads_secret_values(request, head) and not self.allow_secret_values:
            return _forbidden(
                "Secret values are not served through this tunnel "
                "(the agent runs without --allow-secret-values)"
            )
        return None


@functools.lru_cache(maxsize=64)
def _identity_refusal(headers: Headers) -> Refusal | None:
    # Remembered per header block, which the same callers repeat with every
    # request (at most 64 blocks, each within the protocol's header limit).
    user = None
    for name, value in headers:
        if not name.startswith("impersonate-"):
            continue
        if name not in ("impersonate-user", "impersonate-group"):
            return _forbidden(f"the {name} header is not allowed")
        if not value.startswith(IDENTITY_PREFIX) or value.startswith(IDENTITY_PREFIX + "system"):
            return _forbidden(f"identity {value[:64]!r} is outside {IDENTITY_PREFIX}")
        if name == "impersonate-user":
            if user is not None:
                return _forbidden("more than one Impersonate-User")
            user = value
    if user is None:
        return _forbidden("the request carries no tunnel identity")
    return None


def _reads_secret_values(request: ApiRequest, head: RequestHead) -> bool:
    if request.resource != "secrets" or request.api_group or request.subresource:
        return False
    if request.verb not in ("get", "list", "watch"):
        return False
    # Tables list names and ages, never data.
    accept = head.header("accept") or ""
    return "as=Table" not in accept


def _forbidden(message: str) -> Refusal:
    return Refusal(403, "Forbidden", message)
