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

from ..auth import authenticate, confirm
from ..context import CONTEXT, ServerContext
from ..errors import BadRequestError, ForbiddenError
from ..httpjson import json_response, read_body, timestamp
from ..store.base import User
from ..store.commands import CommandRecord
from .specs import SpecError, spec_facts

__all__ = ["setup_command_api"]

MAX_SPEC_BODY = 1024 * 1024
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
    await context.store.get_cluster(cluster)
    await _require_dispatch(context, user, cluster)
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
    try:
        limit = int(request.query.get("limit", "100"))
    except ValueError as exc:
        raise BadRequestError("limit must be a number") from exc
    records = await context.store.list_commands(
        cluster=request.query.get("cluster") or None, state=state, limit=limit
    )
    visible = [r for r in records if user.is_admin or r.submitter == user.name]
    return json_response([command_view(record) for record in visible])


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
    """Log lines as JSON records; with ``follow=1``, until the command finishes."""
    user = await authenticate(request)
    record = await _visible_command(request, user)
    context = request.app[CONTEXT]
    follow = request.query.get("follow", "") in ("1", "true")
    try:
        after = int(request.query.get("after", "0"))
    except ValueError as exc:
        raise BadRequestError("after must be a number") from exc
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(request)
    while True:
        # Read the state before the lines: a final state seen here means every
        # line the command wrote is already stored.
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
            break
        await context.commands.wait_change(record.id, patience=15.0)
    await response.write(_ndjson({"command": command_view(record)}))
    await response.write_eof()
    return response


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
    if user.is_admin:
        return
    grant = await context.access.grant(user.name, cluster)
    if grant is None or not grant.commands:
        raise ForbiddenError(
            f"user {user.name} may not dispatch commands to {cluster} "
            f"(tunnelctl grant {user.name} --cluster {cluster} --commands)",
            code="commands_not_granted",
        )


async def _visible_command(request: web.Request, user: User) -> CommandRecord:
    record = await request.app[CONTEXT].store.get_command(request.match_info["id"])
    if not user.is_admin and record.submitter != user.name:
        raise ForbiddenError("only the submitter or an admin may see this command")
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
