"""``metav1.Status`` bodies, shaped and worded as the API server writes them.

Handlers raise :class:`ApiError`; the app turns it into the JSON Status and
HTTP code. The helpers build the common ones with the real server's messages
(``pods "x" not found``, ``pods "x" already exists`` ...), so kubectl prints
exactly what it prints against a real cluster.
"""

from __future__ import annotations

from typing import Any

from tests.kubestub.kinds import ResourceKind

__all__ = [
    "ApiError",
    "already_exists",
    "bad_request",
    "conflict",
    "expired",
    "forbidden",
    "invalid",
    "method_not_allowed",
    "not_acceptable",
    "not_found",
    "path_not_found",
    "status_body",
    "success_status",
    "unauthorized",
    "unsupported_media_type",
]


class ApiError(Exception):
    """A request that fails with a Status: the HTTP code and the body to send."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def body(self) -> dict[str, Any]:
        """The Status object for this error."""
        return status_body(self.code, self.reason, self.message, self.details)


def status_body(
    code: int, reason: str, message: str, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A failure Status as the server encodes it (empty fields omitted)."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
    }
    if reason:
        body["reason"] = reason
    if details is not None:
        body["details"] = details
    body["code"] = code
    return body


def success_status(kind: ResourceKind, name: str, uid: str) -> dict[str, Any]:
    """The Status Success a DELETE answers with when it does not return the object."""
    details: dict[str, Any] = {"name": name}
    if kind.group:
        details["group"] = kind.group
    details["kind"] = kind.plural
    details["uid"] = uid
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": details,
    }


def _qualified(kind: ResourceKind) -> str:
    """``pods`` or ``deployments.apps``: how the server names a resource in messages."""
    return f"{kind.plural}.{kind.group}" if kind.group else kind.plural


def _details(kind: ResourceKind, name: str, *, use_kind: bool = False) -> dict[str, Any]:
    details: dict[str, Any] = {}
    if name:
        details["name"] = name
    if kind.group:
        details["group"] = kind.group
    # The server puts the resource (plural) in details.kind, except for Invalid.
    details["kind"] = kind.kind if use_kind else kind.plural
    return details


def not_found(kind: ResourceKind, name: str) -> ApiError:
    """404 NotFound: ``pods "x" not found``."""
    return ApiError(404, "NotFound", f'{_qualified(kind)} "{name}" not found', _details(kind, name))


def already_exists(kind: ResourceKind, name: str) -> ApiError:
    """409 AlreadyExists: ``pods "x" already exists``."""
    return ApiError(
        409, "AlreadyExists", f'{_qualified(kind)} "{name}" already exists', _details(kind, name)
    )


def conflict(kind: ResourceKind, name: str, why: str) -> ApiError:
    """409 Conflict: ``Operation cannot be fulfilled on pods "x": <why>``."""
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {_qualified(kind)} "{name}": {why}',
        _details(kind, name),
    )


def invalid(kind: ResourceKind, name: str, causes: list[tuple[str, str, str]]) -> ApiError:
    """422 Invalid; ``causes`` are (field, reason, message) triples."""
    parts = [f"{field}: {message}" for field, _, message in causes]
    joined = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    details = _details(kind, name, use_kind=True)
    details["causes"] = [
        {"reason": reason, "message": message, "field": field} for field, reason, message in causes
    ]
    label = f"{kind.kind}.{kind.group}" if kind.group else kind.kind
    return ApiError(422, "Invalid", f'{label} "{name}" is invalid: {joined}', details)


def forbidden(
    user: str,
    verb: str,
    kind_plural: str,
    group: str,
    name: str,
    namespace: str,
    subresource: str = "",
) -> ApiError:
    """403 Forbidden worded as RBAC words it."""
    resource = f"{kind_plural}/{subresource}" if subresource else kind_plural
    qualified = f"{kind_plural}.{group}" if group else kind_plural
    subject = f'{qualified} "{name}"' if name else qualified
    scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
    message = (
        f'{subject} is forbidden: User "{user}" cannot {verb} resource "{resource}" '
        f'in API group "{group}" {scope}'
    )
    details: dict[str, Any] = {}
    if name:
        details["name"] = name
    if group:
        details["group"] = group
    details["kind"] = kind_plural
    return ApiError(403, "Forbidden", message, details)


def unauthorized() -> ApiError:
    """401 Unauthorized, as for a missing or unknown token."""
    return ApiError(401, "Unauthorized", "Unauthorized")


def path_not_found() -> ApiError:
    """404 for a path the server does not serve at all."""
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})


def bad_request(message: str) -> ApiError:
    """400 BadRequest."""
    return ApiError(400, "BadRequest", message)


def method_not_allowed(message: str) -> ApiError:
    """405 MethodNotAllowed."""
    return ApiError(405, "MethodNotAllowed", message)


def not_acceptable(message: str) -> ApiError:
    """406 NotAcceptable."""
    return ApiError(406, "NotAcceptable", message)


def unsupported_media_type(content_type: str) -> ApiError:
    """415 UnsupportedMediaType."""
    return ApiError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format ({content_type}) - accepted media "
        "types include: application/json, application/yaml",
    )


def expired(message: str) -> ApiError:
    """410 Expired (Gone): a resourceVersion or continue token that is too old."""
    return ApiError(410, "Expired", message)
