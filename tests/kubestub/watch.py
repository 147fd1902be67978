"""``?watch=true``: a stream of ``{"type": ..., "object": ...}`` lines, one per change.

resourceVersion semantics are the real server's: unset or ``0`` first sends
every current object as ADDED; a number resumes after it, and one older than
the kept history gets an ERROR event carrying a 410 Expired Status (the
watch cache answers that way, so clients relist). ``allowWatchBookmarks``
adds BOOKMARK events; ``sendInitialEvents=true`` ends the initial ADDED events
with a bookmark annotated ``k8s.io/initial-events-end``. ``timeoutSeconds``
ends the stream; each event is written (and flushed) as it happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from aiohttp import web

from tests.kubestub.kinds import ResourceKind
from tests.kubestub.negotiation import Representation
from tests.kubestub.selectors import Selector
from tests.kubestub.state import ClusterState
from tests.kubestub.status import ApiError, bad_request
from tests.kubestub.tables import partial_metadata, table

__all__ = ["serve_watch"]


def _flag(request: web.Request, name: str) -> bool | None:
    value = request.query.get(name)
    if value is None:
        return None
    return value.lower() in ("true", "1")


class _Encoder:
    """Turns events into lines in the negotiated representation."""

    def __init__(self, kind: ResourceKind, representation: Representation, include: str) -> None:
        self.kind = kind
        self.representation = representation
        self.include = include
        self.headers_sent = False

    def line(self, event_type: str, obj: dict[str, Any]) -> bytes:
        if event_type in ("ERROR", "BOOKMARK"):
            body = obj
        elif self.representation.form == "table":
            body = table(
                self.kind,
                [obj],
                resource_version=obj["metadata"]["resourceVersion"],
                include_object=self.include,
                headers=not self.headers_sent,
            )
            body["apiVersion"] = f"meta.k8s.io/{self.representation.meta_version}"
            self.headers_sent = True
        elif self.representation.form == "metadata":
            body = partial_metadata(obj)
        else:
            body = obj
        return json.dumps({"type": event_type, "object": body}).encode() + b"\n"


def _bookmark(kind: ResourceKind, rv: int, *, initial_end: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"resourceVersion": str(rv), "creationTimestamp": None}
    if initial_end:
        meta["annotations"] = {"k8s.io/initial-events-end": "true"}
    return {"kind": kind.kind, "apiVersion": kind.api_version, "metadata": meta}


async def serve_watch(
    request: web.Request,
    state: ClusterState,
    kind: ResourceKind,
    namespace: str,
    labels: Selector,
    fields: Selector,
    representation: Representation,
) -> web.StreamResponse:
    """Stream watch events for ``kind`` until timeout, server stop or the client leaving."""
    query = request.query
    rv_text = query.get("resourceVersion", "")
    since: int | None = None
    if rv_text not in ("", "0"):
        try:
            since = int(rv_text)
        except ValueError as exc:
            raise bad_request(
                f'resourceVersion: Invalid value: "{rv_text}": must be an integer'
            ) from exc
    bookmarks = bool(_flag(request, "allowWatchBookmarks"))
    initial = _flag(request, "sendInitialEvents")
    if initial and not bookmarks:
        raise ApiError(
            422,
            "Invalid",
            "sendInitialEvents: Forbidden: sendInitialEvents requires setting allowWatchBookmarks "
            "to true",
        )
    timeout = state.settings.max_watch_seconds
    if query.get("timeoutSeconds"):
        try:
            timeout = min(timeout, float(int(query["timeoutSeconds"])))
        except ValueError as exc:
            raise bad_request("timeoutSeconds must be an integer") from exc
    store = state.store
    replay = initial if initial is not None else since is None
    items = store.list(kind, namespace, labels, fields) if replay else []
    error: ApiError | None = None
    try:
        watcher = store.watch(
            kind, namespace, labels, fields, store.resource_version if replay else since
        )
    except ApiError as exc:
        if exc.code != 410:
            raise
        error, watcher = exc, None
    encoder = _Encoder(kind, representation, query.get("includeObject", "Metadata"))
    response = web.StreamResponse(headers={"Content-Type": representation.content_type})
    response.enable_chunked_encoding()
    try:
        await response.prepare(request)
        if error is not None or watcher is None:
            assert error is not None
            await response.write(encoder.line("ERROR", error.body()))
            await response.write_eof()
            return response
        for obj in items:
            await response.write(encoder.line("ADDED", obj))
        if initial:
            bookmark = _bookmark(kind, store.resource_version, initial_end=True)
            await response.write(encoder.line("BOOKMARK", bookmark))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            wait = min(remaining, state.settings.bookmark_interval) if bookmarks else remaining
            try:
                event = await asyncio.wait_for(watcher.queue.get(), timeout=wait)
            except TimeoutError:
                if bookmarks and loop.time() < deadline:
                    bookmark = _bookmark(kind, store.resource_version)
                    await response.write(encoder.line("BOOKMARK", bookmark))
                continue
            if event is None:
                break
            await response.write(encoder.line(event.type, event.obj))
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()
    except ConnectionResetError:
        pass  # The client went away mid-stream: there is no one left to answer.
    finally:
        if watcher is not None:
            store.stop_watch(watcher)
    return response
