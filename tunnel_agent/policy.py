"""The agent's own rules for relayed requests.

The cluster owner trusts the agent, not the server; so the agent checks every
request before it reaches the API server, whatever the server allowed: only
the API server as target (paths, never host:port, and only paths it cannot
read otherwise than the agent does), only ``tunnel:`` identities (and no
identity header spelled with ``_``, which a proxy could read as one), and
optionally read-only, a namespace scope, and no Secret values.

No Secret values (the default) leaves one thing to do with Secrets: list their
names. Every other answer about a Secret can carry its values: a get, list or
watch as JSON or as a Table with ``includeObject=Object``; the object a
create, update, patch (a dry run included) or delete returns; even the object
metadata a Table carries by default, whose ``last-applied-configuration``
annotation holds what ``kubectl apply`` sent. So the agent refuses all of
those, and rewrites a Table request itself (the ``Accept`` header and
``includeObject``) rather than trusting how the API server would read the
caller's version of them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode

from protocol.http import Headers, RequestHead
from tunnel_kube import UNPLAIN_PATH, ApiRequest, is_plain_path, parse_api_request

__all__ = ["IDENTITY_PREFIX", "ProxyPolicy", "Refusal"]

IDENTITY_PREFIX = "tunnel:"
#: Headers that name an identity: impersonation, and the API server's front-proxy
#: headers (--requestheader-*-headers' defaults, which kubeproxy.py drops).
_IDENTITY_SHAPED = ("impersonate-", "x-remote-")

#: Requests that only ask the API server about the caller itself: their groups and
#: resources (cluster-scoped, created by a POST to the collection).
_SELF_REVIEWS = frozenset(
    {
        ("authorization.k8s.io", "selfsubjectaccessreviews"),
        ("authorization.k8s.io", "selfsubjectrulesreviews"),
        ("authentication.k8s.io", "selfsubjectreviews"),
    }
)
#: Paths outside the API's resources that a namespace-scoped agent serves: discovery,
#: the OpenAPI documents, the version, health, and the service-account issuer's keys.
_SCOPED_NON_RESOURCE = (
    "/api",
    "/apis",
    "/version",
    "/openapi",
    "/healthz",
    "/livez",
    "/readyz",
    "/.well-known",
    "/openid",
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

    def check(self, head: RequestHead) -> RequestHead | Refusal:
        """The request as it may go on (narrowed, for Secrets), or why it may not."""
        refusal = _identity_refusal(head.headers)
        if refusal is not None:
            return refusal
        if not is_plain_path(head.path.partition("?")[0]):
            # Classified below as sent, it could name something else to the API server.
            return Refusal(400, "BadRequest", UNPLAIN_PATH)
        request = parse_api_request(head.method, head.path)
        self_review = _is_self_review(request)
        if self.read_only:
            if not (request.is_read or self_review):
                what = request.subresource or request.verb
                return _forbidden(f"this agent is read-only: {what} is not allowed")
            if head.upgrade and (request.verb != "watch" or request.subresource):
                # An interactive session on a subresource read as a get (a
                # virtual machine's console, say) is as good as exec. A watch
                # names no subresource (and ?watch counts only on collections).
                what = request.subresource or request.path
                return _forbidden(
                    f"this agent is read-only: an interactive connection to {what[:64]!r}"
                    " is not allowed"
                )
        if self.namespaces and not self_review:
            refusal = self._out_of_scope(request)
            if refusal is not None:
                return refusal
        if request.resource == "secrets" and not request.api_group and not self.allow_secret_values:
            return _secret_names_only(request, head)
        return head

    def _out_of_scope(self, request: ApiRequest) -> Refusal | None:
        """Why a namespace-scoped agent refuses ``request``, or None."""
        if not request.is_resource:
            path = request.path.rstrip("/")
            if any(path == p or path.startswith(p + "/") for p in _SCOPED_NON_RESOURCE):
                return None
            # The API server's logs, metrics, profiles: cluster-wide.
            return _forbidden(
                f"this agent serves namespaces {self._scope()} only, not {request.path[:64]!r}"
            )
        if request.namespace not in self.namespaces:
            where = request.namespace or "cluster-wide"
            return _forbidden(
                f"this agent serves namespaces {self._scope()} only, not {where} requests"
            )
        if request.resource == "namespaces" and not request.api_group and not request.is_read:
            # The Namespace object is cluster-scoped: its labels (Pod Security
            # admission), finalizers and its deletion are the cluster owner's.
            return _forbidden(
                f"this agent serves what is in namespaces {self._scope()}, not changes to the "
                f"Namespace object {request.namespace!r} itself"
            )
        return None

    def _scope(self) -> str:
        """The namespaces served, for a refusal's message (not worked out for each request)."""
        return ", ".join(sorted(self.namespaces))


def _is_self_review(request: ApiRequest) -> bool:
    """A caller asking about itself: a create in the review's own group, on the collection."""
    return (
        request.verb == "create"
        and (request.api_group, request.resource) in _SELF_REVIEWS
        and not request.namespace
        and not request.name
        and not request.subresource
    )


@functools.lru_cache(maxsize=64)
def _identity_refusal(headers: Headers) -> Refusal | None:
    # Remembered per header block, which the same callers repeat with every
    # request (at most 64 blocks, each within the protocol's header limit).
    user = None
    for name, value in headers:
        if not name.startswith("impersonate-"):
            if "_" in name:
                refusal = _disguised_identity(name)
                if refusal is not None:
                    return refusal
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


def _disguised_identity(name: str) -> Refusal | None:
    """Why a header spelled with "_" is refused, if it names an identity.

    A proxy in front of the API server that reads "_" as "-" (as CGI-style
    servers do) would take ``Impersonate_User`` for ``Impersonate-User``,
    past the identity check above; ``X_Remote_User`` for the front-proxy
    identity header. A request carrying one is trying something: refused,
    not dropped.
    """
    folded = name.replace("_", "-")
    if not folded.startswith(_IDENTITY_SHAPED):
        return None
    return _forbidden(
        f"the {name[:64]} header is not allowed: a proxy that reads '_' as '-' would take it "
        f"for {folded[:64]}, which names an identity"
    )


#: What a Table of Secrets may be written as.
_TABLE_MEDIA_TYPES = ("application/json", "application/yaml")
_NO_VALUES = "(the agent runs without --allow-secret-values)"


def _secret_names_only(request: ApiRequest, head: RequestHead) -> RequestHead | Refusal:
    """A request about Secrets narrowed to a Table of names, or refused."""
    if request.verb not in ("get", "list", "watch"):
        return _forbidden(
            "Secrets can only be listed by name through this tunnel: the API server's "
            f"answer to a {request.verb} would carry their values {_NO_VALUES}"
        )
    accept = _table_accept(head.header("accept") or "")
    if not accept:
        return _forbidden(
            "Secret values are not served through this tunnel; a table of their names is, "
            f"as `kubectl get secrets` asks for it {_NO_VALUES}"
        )
    path, _, query = head.path.partition("?")
    kept = []
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name.lower() != "includeobject":
            kept.append((name, value))
        elif value != "None" and value != "Metadata":
            return _forbidden(
                # repr: the caller's text goes into the agent's log, escaped.
                f"includeObject={value[:32]!r} would carry the Secrets' values, and is not "
                f"allowed through this tunnel (kubectl get --sort-by asks for it) {_NO_VALUES}"
            )
    # Not even the metadata: its last-applied-configuration annotation can
    # hold the values that kubectl apply sent.
    kept.append(("includeObject", "None"))
    headers = (*((n, v) for n, v in head.headers if n != "accept"), ("accept", accept))
    return RequestHead(head.method, f"{path}?{urlencode(kept)}", headers, head.upgrade)


def _table_accept(accept: str) -> str:
    """The caller's ``Accept``, kept to its Table media ranges and written anew; or ''.

    Each range is rebuilt from what was checked, so no parameter the caller
    added (a second ``as``, say) reaches the API server to make it answer
    something else.
    """
    tables = []
    for media_range in accept.split(","):
        media_type, *parameters = (part.strip() for part in media_range.split(";"))
        if media_type.lower() not in _TABLE_MEDIA_TYPES:
            continue
        pairs = [parameter.partition("=") for parameter in parameters]
        values: dict[str, list[str]] = {}
        for name, _, value in pairs:
            name = name.strip().lower()
            if name != "q":
                values.setdefault(name, []).append(value.strip())
        if (
            values.get("as") == ["Table"]
            and values.get("g") == ["meta.k8s.io"]
            and values.get("v") in (["v1"], ["v1beta1"])
            and len(values) == 3
        ):
            tables.append(f"{media_type.lower()};as=Table;v={values['v'][0]};g=meta.k8s.io")
    return ",".join(tables)


def _forbidden(message: str) -> Refusal:
    return Refusal(403, "Forbidden", message)
