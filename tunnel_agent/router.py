"""Routes each stream the server opens to the handler of its kind."""

from __future__ import annotations

from protocol.errors import ErrorCode
from tunnel_mux import MuxStream

from .connector import StreamHandler

__all__ = ["StreamRouter"]


class StreamRouter:
    """A stream handler that dispatches on the stream's kind; others are refused."""

    def __init__(self) -> None:
        self._handlers: dict[str, StreamHandler] = {}

    def add(self, kind: str, handler: StreamHandler) -> None:
        self._handlers[kind] = handler

    async def __call__(self, stream: MuxStream) -> None:
        handler = self._handlers.get(stream.kind)
        if handler is None:
            stream.reset(ErrorCode.REFUSED_STREAM, f"this agent serves no {stream.kind} streams")
            return
        await handler(stream)
