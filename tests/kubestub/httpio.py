"""Request bodies in, JSON responses out: bounded reads and the server's encodings.

Bodies are read up to :data:`MAX_BODY` bytes (the real server's limit is
3 MiB for most requests) and decoded as JSON, YAML (server-side apply) or
Kubernetes protobuf (what kubectl's typed clients send, see
:mod:`tests.kubestub.protobuf`).
"""

from __future__ import annotations

import json
from typing import Any

import yaml
from aiohttp import web

from tests.kubestub.protobuf import PROTOBUF, decode_object
from tests.kubestub.status import ApiError, bad_request, unsupported_media_type

__all__ = [
    "MAX_BODY",
    "json_response",
    "media_type",
    "read_body",
    "read_raw",
    "wants_pretty",
]

MAX_BODY = 3 * 1024 * 1024
"""The largest request body accepted, as the API server's default limit."""


def media_type(header: str) -> str:
    """The media type of a Content-Type header, without parameters, lower case."""
    return header.split(";", 1)[0].strip().lower()


async def read_raw(request: web.Request, limit: int) -> bytes:
    """The request body, refused with 413 past ``limit`` bytes (never read further)."""
    too_large = ApiError(
        413, "RequestEntityTooLarge", f"Request entity too large: limit is {limit}"
    )
    if request.content_length is not None and request.content_length > limit:
        raise too_large
    chunks: list[bytes] = []
    total = 0
    while chunk := await request.content.read(64 * 1024):
        total += len(chunk)
        if total > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


async def read_body(request: web.Request, *, allow_yaml: bool = False) -> Any:
    """Read and decode a request body (JSON; YAML too when ``allow_yaml``)."""
    raw = await read_raw(request, MAX_BODY)
    if not raw:
        raise bad_request("the body of the request is empty")
    content_type = media_type(request.headers.get("Content-Type", "application/json"))
    if content_type == PROTOBUF:
        return decode_object(raw)
    if allow_yaml or content_type in ("application/yaml", "application/apply-patch+yaml"):
        try:
            return yaml.safe_load(raw.decode("utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise bad_request(f"error decoding YAML: {exc}") from exc
    if content_type.endswith("json") or content_type in ("", "*/*"):
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise bad_request(
                f"Object 'Kind' is missing in '{raw[:64].decode('utf-8', 'replace')}'"
            ) from exc
    raise unsupported_media_type(content_type)


def wants_pretty(request: web.Request) -> bool:
    """Whether ``?pretty=true`` asks for indented JSON."""
    return request.query.get("pretty", "").lower() in ("true", "1")


def json_response(
    body: Any,
    status: int = 200,
    *,
    content_type: str = "application/json",
    pretty: bool = False,
) -> web.Response:
    """A JSON response with the server's Content-Type."""
    text = json.dumps(body, indent=4 if pretty else None)
    return web.Response(
        body=text.encode() + (b"\n" if pretty else b""),
        status=status,
        headers={"Content-Type": content_type},
    )
