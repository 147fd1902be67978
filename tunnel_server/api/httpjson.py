"""JSON in and out of the REST API, bounded and validated."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from typing import Any

from aiohttp import web

from tunnel_server.errors import BadRequestError, PayloadTooLargeError, RequestTimeoutError

__all__ = [
    "BODY_TIMEOUT",
    "MAX_JSON_BODY",
    "json_response",
    "read_body",
    "read_json",
    "require_str",
    "timestamp",
]

#: The largest JSON body the API reads.
MAX_JSON_BODY = 256 * 1024
#: How long a request body may take to arrive. The connection is held
#: meanwhile, and a bootstrap's is held before anything proves who sent it.
BODY_TIMEOUT = 30.0


async def read_body(request: web.Request, limit: int, what: str = "the request body") -> bytes:
    """The whole body, at most ``limit`` bytes, within :data:`BODY_TIMEOUT`; or 413/408."""
    too_large = f"{what} may be at most {limit} bytes"
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLargeError(too_large)
    body = bytearray()
    try:
        async with asyncio.timeout(BODY_TIMEOUT):
            while chunk := await request.content.readany():
                body += chunk
                if len(body) > limit:
                    raise PayloadTooLargeError(too_large)
    except TimeoutError as exc:
        raise RequestTimeoutError(
            f"{what} did not arrive within {BODY_TIMEOUT:g} s ({len(body)} bytes came)"
        ) from exc
    return bytes(body)


async def read_json(request: web.Request, limit: int = MAX_JSON_BODY) -> dict[str, Any]:
    """The request's JSON object body, at most ``limit`` bytes, or 400/408/413."""
    body = await read_body(request, limit)
    try:
        value = json.loads(body or b"{}")
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequestError(f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise BadRequestError("the request body must be a JSON object")
    return value


def require_str(body: dict[str, Any], key: str, *, max_length: int) -> str:
    """``body[key]`` as a non-empty string of at most ``max_length`` characters."""
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise BadRequestError(f"field {key!r} must be a non-empty string")
    if len(value) > max_length:
        raise BadRequestError(f"field {key!r} is longer than {max_length} characters")
    return value


def timestamp(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def json_response(data: Any, *, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=lambda v: json.dumps(v, default=str))
