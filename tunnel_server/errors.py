"""Errors of the tunnel server::

    TunnelError                      (protocol.errors)
    └── ServerError
        ├── ConfigError              bad flags, state dir or TLS files
        └── ApiError                 answered to an HTTP caller with ``status``
            ├── BadRequestError          400
            ├── UnauthorizedError        401
            ├── ForbiddenError           403
            ├── NotFoundApiError         404
            ├── ConflictError            409
            ├── PayloadTooLargeError     413
            ├── TooManyRequestsError     429 (with Retry-After)
            └── UnavailableError         503 (with Retry-After)

Every ApiError carries a short machine-readable ``code`` and a message a
person can act on; both go to the caller, so neither holds secrets.
"""

from __future__ import annotations

from protocol.errors import TunnelError

__all__ = [
    "ApiError",
    "BadRequestError",
    "ConfigError",
    "ConflictError",
    "ForbiddenError",
    "NotFoundApiError",
    "PayloadTooLargeError",
    "ServerError",
    "TooManyRequestsError",
    "UnauthorizedError",
    "UnavailableError",
]


class ServerError(TunnelError):
    """The server cannot do what was asked."""


class ConfigError(ServerError):
    """The server's configuration or state directory cannot be used."""


class ApiError(ServerError):
    """An error answered to an HTTP caller; with ``retry_after``, also a Retry-After header."""

    status = 500
    code = "internal"
    retry_after: float | None = None

    def __init__(
        self, message: str, *, code: str | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if retry_after is not None:
            self.retry_after = retry_after


class BadRequestError(ApiError):
    status = 400
    code = "bad_request"


class UnauthorizedError(ApiError):
    status = 401
    code = "unauthorized"


class ForbiddenError(ApiError):
    status = 403
    code = "forbidden"


class NotFoundApiError(ApiError):
    status = 404
    code = "not_found"


class ConflictError(ApiError):
    status = 409
    code = "conflict"


class RequestTimeoutError(ApiError):
    status = 408
    code = "request_timeout"


class PayloadTooLargeError(ApiError):
    status = 413
    code = "payload_too_large"


class TooManyRequestsError(ApiError):
    """The caller sends faster than the server takes; ``retry_after`` says when to try again."""

    status = 429
    code = "too_many_requests"
    retry_after = 1.0


class UnavailableError(ApiError):
    """The service cannot answer now; ``retry_after`` says when to try again."""

    status = 503
    code = "unavailable"
    retry_after = 1.0
