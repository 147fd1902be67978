"""The REST API for commands, under /api/v1.

``POST /api/v1/clusters/{cluster}/commands`` takes a spec (JSON, or YAML with
``Content-Type: application/yaml``), validates it, stores it durably and
answers at once with its id; ``Idempotency-Key`` (header, or
``idempotency_key`` in a JSON envelope) returns the existing command instead
of a duplicate. The admin, or a user with a ``commands`` grant, may dispatch.
"""

from __future__ import annotations

import json
import time
from typing import Any

import yaml
from aiohttp import web

from tunnel_cli import describe_duration
from tunnel_server.access.auth import authenticate, confirm
from tunnel_server.api.httpjson import json_response, read_body, timestamp
from tunnel_server.commands.dispatcher import wait_for_change
from tunnel_server.commands.specs import SpecError, spec_facts
from tunnel_server.context import CONTEXT, ServerContext
from tunnel_server.errors import (
    BadRequestError,
    ForbiddenError,
    NotFoundApiError,
    TooManyRequestsError,
)
from tunnel_server.store.base import NotFoundError, StoreError, User
from tunnel_server.store.commands import MAX_LIST, CommandRecord

__all__ = ["setup_command_api"]

MAX_SPEC_BODY = 1024 * 1024
#: Seconds a follow waits for a change before it sends a keepalive record.
FOLLOW_PATIENCE = 15.0
#: Command logs one user may follow at once.
MAX_FOLLOWS_PER_USER = 16
_STATES = (
    "pending",
    "delivered",
    "running",
    "succeeded",
    "failed",
    "cancelled",
    "timed_out",
    "lost",
)


def setup_command_api(app: web.Application) -> None:
    router = app.router
    router.add_post("/api/v1/clusters/{cluster}/commands", submit_command)
    router.add_get("/api/v1/commands", list_commands)
    router.add_get("/api/v1/commands/{id}", show_command)
    router.add_post("/api/v1/commands/{id}/cancel", cancel_command)
    router.add_get("/api/v1/commands/{id}/logs", command_logs)


async def submit_command(request: web.Request) -> web.Response:
    user = await authenticate(request)
    context = request.app[CONTEXT]
    cluster = request.match_info["cluster"]
    # The grant first: to a user without one, a cluster that does not exist looks the same.
    await _require_dispatch(context, user, cluster)
    await context.store.get_cluster(cluster)
    spec, key = await _read_submission(request)
    try:
        spec, facts = spec_facts(spec)
    except SpecError as exc:
        raise BadRequestError(str(exc), code="invalid_spec") from exc
    # Again after the body: a token revoked or a grant taken away meanwhile stops it.
    await confirm(request, user)
    await _require_dispatch(context, user, cluster)
    record, created = await context.commands.submit(cluster, user.name, spec, facts, key)
    return json_response(command_view(record), status=201 if created else 200)


async def list_commands(request: web.Request) -> web.Response:
    user = await authenticate(request)
    context = request.app[CONTEXT]
    state = request.query.get("state") or None
    if state is not None and state not in _STATES:
        raise BadRequestError(f"state must be one of {', '.join(_STATES)}")
    value = request.query.get("limit", "100")
    limit = int(value) if value.isascii() and value.isdigit() else 0
    if not 1 <= limit <= MAX_LIST:
        raise BadRequestError(f"limit must be a number from 1 to {MAX_LIST}, not {value[:32]!r}")
    records = await context.store.list_commands(
        cluster=request.query.get("cluster") or None,
        state=state,
        limit=limit,
        # In the query, not after it: another's commands must not fill a user's page.
        submitter=None if user.is_admin else user.name,
    )
    return json_response([command_view(record) for record in records])


async def show_command(request: web.Request) -> web.Response:
    user = await authenticate(request)
    record = await _visible_command(request, user)
    view = command_view(record)
    view["spec"] = record.spec
    return json_response(view)


async def cancel_command(request: web.Request) -> web.Response:
    user = await authenticate(request)
    record = await _visible_command(request, user)
    context = request.app[CONTEXT]
    if record.finished:
        return json_response(command_view(record))
    return json_response(command_view(await context.commands.cancel(record.id, user.name)))


async def command_logs(request: web.Request) -> web.StreamResponse:
    """Log lines as JSON records; with ``follow=1``, until the command finishes.

    A follow sends ``{"keepalive": true}`` after each quiet :data:`FOLLOW_PATIENCE`,
    so that no idle timeout on the way cuts it. Once the answer has begun, a
    failure can no longer change its status: it ends the stream with an
    ``{"error": ...}`` record instead.
    """
    user = await authenticate(request)
    record = await _visible_command(request, user)
    context = request.app[CONTEXT]
    follow = request.query.get("follow", "") in ("1", "true")
    after = _log_position(request.query.get("after", "0"))
    following = context.commands.follows
    if follow and following[user.name] >= MAX_FOLLOWS_PER_USER:
        # Each follow holds a caller connection for as long as the command runs.
        raise TooManyRequestsError(
            f"user {user.name} already follows {MAX_FOLLOWS_PER_USER} command logs, the most"
            " one user may; end one, or read without --follow"
        )
    if follow:
        following[user.name] += 1  # counted before any await: no second request slips in
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    try:
        await response.prepare(request)
        record = await _stream_log(response, context, record, after, follow)
    except StoreError as exc:
        why = (
            f"command {record.id} was deleted while being read (its retention passed)"
            if isinstance(exc, NotFoundError)
            else f"the server could not read the log: {exc}; follow again to go on"
        )
        await response.write(_ndjson({"error": why}))
    else:
        await response.write(_ndjson({"command": command_view(record)}))
    finally:
        if follow:
            following[user.name] -= 1
            if not following[user.name]:
                del following[user.name]
    await response.write_eof()
    return response


async def _stream_log(
    response: web.StreamResponse,
    context: ServerContext,
    record: CommandRecord,
    after: int,
    follow: bool,
) -> CommandRecord:
    """Write the log lines after ``after``; with ``follow``, until the command ends."""
    while True:
        # The change to wait for is taken first, then the state, then the
        # lines: a final state seen here means every line is already stored.
        change = context.commands.change_of(record.id)
        record = await context.store.get_command(record.id)
        lines = await context.store.command_log(record.id, after=after, limit=1000)
        for line in lines:
            after = line.seq
            await response.write(
                _ndjson(
                    {
                        "seq": line.seq,
                        "attempt": line.attempt,
                        "time": timestamp(line.time),
                        "text": line.text,
                    }
                )
            )
        if len(lines) == 1000:
            continue
        if not follow or record.finished:
            return record
        if not await wait_for_change(change, FOLLOW_PATIENCE):
            await response.write(_ndjson({"keepalive": True}))


def _log_position(value: str) -> int:
    """``after``: a log line's sequence number, 0 for the start."""
    after = int(value) if value.isascii() and value.isdigit() else -1
    if not 0 <= after < 2**63:
        raise BadRequestError(f"after must be a log line's number (0 or more), not {value[:32]!r}")
    return after


async def _read_submission(request: web.Request) -> tuple[dict[str, Any], str | None]:
    body = await read_body(request, MAX_SPEC_BODY, "a command spec")
    key = request.headers.get("Idempotency-Key")
    content_type = request.content_type
    try:
        if content_type in ("application/yaml", "application/x-yaml", "text/yaml"):
            document = yaml.safe_load(body)
        else:
            document = json.loads(body or b"null")
    except (yaml.YAMLError, ValueError, UnicodeDecodeError) as exc:
        raise BadRequestError(f"the command is not valid {content_type}: {exc}") from exc
    if isinstance(document, dict) and "spec" in document and "apiVersion" not in document:
        # The JSON envelope: {"spec": {...}, "idempotency_key": "..."}.
        key = document.get("idempotency_key", key)
        document = document["spec"]
    if not isinstance(document, dict):
        raise BadRequestError("a command must be an object with apiVersion, type, name, spec")
    if key is not None and (not isinstance(key, str) or not 0 < len(key) <= 128):
        raise BadRequestError("an idempotency key is a string of 1..128 characters")
    return document, key


async def _require_dispatch(context: ServerContext, user: User, cluster: str) -> None:
    if not await context.access.may_dispatch(user, cluster):
        raise ForbiddenError(
            f"user {user.name} may not dispatch commands to {cluster} "
            f"(tunnelctl grant {user.name} --cluster {cluster} --commands)",
            code="commands_not_granted",
        )


async def _visible_command(request: web.Request, user: User) -> CommandRecord:
    command_id = request.match_info["id"]
    context = request.app[CONTEXT]
    try:
        record = await context.store.get_command(command_id)
    except NotFoundError:
        record = None
    # Another's command answers as one that does not exist: it is not even confirmed.
    if record is None or not (user.is_admin or record.submitter == user.name):
        retention = describe_duration(context.settings.command_retention)
        raise NotFoundApiError(
            f"no command {command_id!r}: none was submitted with this id, or it finished"
            f" more than {retention} ago and was deleted (--command-retention)"
        )
    return record


def command_view(record: CommandRecord) -> dict[str, Any]:
    return {
        "id": record.id,
        "cluster": record.cluster,
        "submitter": record.submitter,
        "type": record.type,
        "name": record.name,
        "state": record.state,
        "attempt": record.attempt,
        "max_attempts": record.max_attempts,
        "idempotency_key": record.idempotency_key,
        "created_at": timestamp(record.created_at),
        "delivered_at": timestamp(record.delivered_at),
        "started_at": timestamp(record.started_at),
        "finished_at": timestamp(record.finished_at),
        "cancel_requested": record.cancel_requested,
        "result": record.result,
        "error": record.error,
        "log_truncated": record.log_truncated,
        "age_seconds": round(time.time() - record.created_at.timestamp(), 3),
    }


def _ndjson(record: dict[str, Any]) -> bytes:
    return json.dumps(record, default=str).encode() + b"\n"
