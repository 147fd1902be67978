"""Proposed product changes, applied at run time, to measure them before anyone writes them.

The benchmark never edits product code. ``--patch NAME`` applies one of these
in the server or agent process it starts (through :mod:`bench.proxy_server`
and :mod:`bench.proxy_agent`), so the report shows the effect of the proposal
next to the code as it is. Each patch is the smallest version of the change
proposed in ``docs/benchmarks.md``; the real change belongs in the product,
with tests.

- ``handler-cancellation`` (server): aiohttp cancels a request's handler when
  its client disconnects, so the kube proxy resets the stream at once rather
  than when it next writes to the departed client (a quiet watch: never).
- ``cancel-on-reset`` (agent): when the server resets a stream, the session
  cancels that stream's handler, which closes the request to the API server,
  rather than leaving it until the handler next writes to the stream.
- ``audit-linger`` (server): the audit writer lets a batch gather for 50 ms
  before handing it to the SQLite thread, so a busy proxy hands over about
  20 batches a second rather than one per event loop turn.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

__all__ = ["AGENT_PATCHES", "SERVER_PATCHES", "apply"]

SERVER_PATCHES = ("handler-cancellation", "audit-linger")
AGENT_PATCHES = ("cancel-on-reset",)
_LINGER = 0.05


def apply(names: list[str]) -> None:
    """Apply the named patches in this process (unknown names raise ValueError)."""
    for name in names:
        if name == "handler-cancellation":
            _handler_cancellation()
        elif name == "audit-linger":
            _audit_linger()
        elif name == "cancel-on-reset":
            _cancel_on_reset()
        else:
            raise ValueError(f"unknown patch {name!r}")


def _handler_cancellation() -> None:
    from aiohttp import web

    original = web.AppRunner.__init__

    @functools.wraps(original)
    def init(self: web.AppRunner, app: web.Application, **kwargs: Any) -> None:
        kwargs.setdefault("handler_cancellation", True)
        original(self, app, **kwargs)

    web.AppRunner.__init__ = init  # type: ignore[method-assign]


def _audit_linger() -> None:
    from tunnel_server.audit import AuditWriter
    from tunnel_server.store.base import StoreError

    async def write_forever(self: AuditWriter) -> None:
        queue = self._queue
        while True:
            batch = [await queue.get()]
            await asyncio.sleep(_LINGER)  # the proposal: let the batch gather
            while len(batch) < self._max_batch and not queue.empty():
                batch.append(queue.get_nowait())
            try:
                self.written += await self._store.add_audit_events(batch)
            except StoreError:
                pass  # the original logs it; an experiment only counts speed
            finally:
                for _ in batch:
                    queue.task_done()

    AuditWriter._write_forever = write_forever  # type: ignore[method-assign]


def _cancel_on_reset() -> None:
    from protocol import StreamOpened, StreamReset
    from tunnel_mux.session import Session

    accept, dispatch = Session._accept, Session._dispatch
    handlers: dict[tuple[int, int], asyncio.Task[None]] = {}

    def _accept(self: Session, event: StreamOpened) -> None:
        before = set(self._handler_tasks)
        accept(self, event)
        for task in self._handler_tasks - before:
            key = (id(self), event.stream_id)
            handlers[key] = task
            task.add_done_callback(lambda _, key=key: handlers.pop(key, None))  # type: ignore[misc]

    def _dispatch(self: Session, event: Any) -> None:
        dispatch(self, event)
        if type(event) is StreamReset and event.remote:
            task = handlers.pop((id(self), event.stream_id), None)
            if task is not None:
                task.cancel()

    Session._accept = _accept  # type: ignore[method-assign]
    Session._dispatch = _dispatch  # type: ignore[method-assign]
