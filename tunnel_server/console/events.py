"""The live parts of the console, as Server-Sent Events.

``/ui/events/fleet``: each viewer's loop looks at the fleet every
``poll_interval`` (1 s) and sends what changed since its last message (rows
changed or added, names removed) as one ``fleet`` event: at most one per
second per viewer, whatever happens in the fleet. It looks with the viewer's
eyes each time (their grants, their session), so a cluster whose grant is
taken away is removed at the next look, and a session that ended stops the
stream with a ``signed-out`` event.

``/ui/events/commands/{id}``: a command's log lines as they are stored
(``log`` events), its state whenever it changes (``state``), and ``end`` once
it has finished and every line was sent.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from aiohttp import web

from tunnel_server.api.httpjson import timestamp
from tunnel_server.commands.api import MAX_FOLLOWS_PER_USER, command_view
from tunnel_server.commands.dispatcher import wait_for_change
from tunnel_server.console.fleet import fleet_rows
from tunnel_server.console.sessions import Viewer, current_viewer, still_signed_in
from tunnel_server.console.state import CONSOLE
from tunnel_server.console.visibility import visible_clusters, visible_command
from tunnel_server.context import CONTEXT
from tunnel_server.errors import TooManyRequestsError, UnauthorizedError
from tunnel_server.store.base import NotFoundError, StoreError

__all__ = ["command_events", "fleet_events", "sse"]

logger = logging.getLogger(__name__)

#: Seconds of quiet after which a comment line keeps the stream open through proxies.
KEEPALIVE = 15.0
#: Seconds between two checks that a command-log viewer is still signed in.
SESSION_RECHECK = 5.0


def sse(event: str, data: Any) -> bytes:
    """One Server-Sent Event: a name and a line of JSON."""
    return f"event: {event}\ndata: {json.dumps(data, default=str)}\n\n".encode()


async def _start(request: web.Request) -> tuple[Viewer, web.StreamResponse]:
    viewer = await current_viewer(request)
    if viewer is None:
        raise UnauthorizedError("sign in first", code="session_missing")
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-store",
            "X-Accel-Buffering": "no",
        }
    )
    return viewer, response


async def fleet_events(request: web.Request) -> web.StreamResponse:
    """The viewer's fleet, then what changed, at most once per poll interval."""
    viewer, response = await _start(request)
    context = request.app[CONTEXT]
    console = request.app[CONSOLE]
    await response.prepare(request)
    sent: dict[str, dict[str, Any]] = {}
    quiet = 0.0
    while True:
        checked = await still_signed_in(request.app, viewer)
        if checked is None:
            await response.write(sse("signed-out", {}))
            break
        viewer = checked
        try:
            clusters = await visible_clusters(context, viewer.user)
            rows = await fleet_rows(context, console.traffic, clusters)
        except StoreError as exc:
            logger.warning("the fleet's live updates cannot read the store: %s", exc)
            rows = None
        if rows is not None:
            now = {row.name: row.as_json() for row in rows}
            changed = [row for name, row in now.items() if sent.get(name) != row]
            removed = sorted(name for name in sent if name not in now)
            if changed or removed or not sent:
                await response.write(
                    sse("fleet", {"rows": changed, "removed": removed, "full": not sent})
                )
                quiet = 0.0
            sent = now
        if quiet >= KEEPALIVE:
            await response.write(b": keepalive\n\n")
            quiet = 0.0
        await asyncio.sleep(console.poll_interval)
        quiet += console.poll_interval
    return response


async def command_events(request: web.Request) -> web.StreamResponse:
    """A command's log and state as they change, until it has finished."""
    viewer, response = await _start(request)
    context = request.app[CONTEXT]
    record = await visible_command(context, viewer.user, request.match_info["id"])
    value = request.query.get("after", "0")
    after = int(value) if value.isascii() and value.isdigit() and len(value) < 19 else 0
    following = context.commands.follows
    if following[viewer.name] >= MAX_FOLLOWS_PER_USER:
        raise TooManyRequestsError(
            f"user {viewer.name} already follows {MAX_FOLLOWS_PER_USER} command logs, the most"
            " one user may; close a command page"
        )
    following[viewer.name] += 1  # before any await: counted with the REST API's follows
    try:
        await response.prepare(request)
        await _follow(request, response, viewer, record.id, after)
    finally:
        following[viewer.name] -= 1
        if not following[viewer.name]:
            del following[viewer.name]
    return response


async def _follow(
    request: web.Request, response: web.StreamResponse, viewer: Viewer, command_id: str, after: int
) -> None:
    context = request.app[CONTEXT]
    state: dict[str, Any] | None = None
    while True:
        # As the REST API's follow: the change to wait for first, then the state, then
        # the lines, so a final state seen here means every line is stored already.
        change = context.commands.change_of(command_id)
        try:
            record = await context.store.get_command(command_id)
            lines = await context.store.command_log(command_id, after=after, limit=1000)
        except NotFoundError:
            await response.write(sse("end", {"error": "the command was deleted"}))
            return
        for line in lines:
            after = line.seq
            await response.write(
                sse(
                    "log",
                    {
                        "seq": line.seq,
                        "attempt": line.attempt,
                        "time": timestamp(line.time),
                        "text": line.text,
                    },
                )
            )
        view = command_view(record)
        view.pop("age_seconds")
        if view != state:
            state = view
            await response.write(sse("state", view))
        if len(lines) == 1000:
            continue
        if record.finished:
            await response.write(sse("end", {"state": record.state}))
            return
        if not await wait_for_change(change, SESSION_RECHECK):
            # Quiet: is the viewer still signed in? Then a comment keeps the stream open.
            if await still_signed_in(request.app, viewer) is None:
                await response.write(sse("signed-out", {}))
                return
            await response.write(b": keepalive\n\n")
