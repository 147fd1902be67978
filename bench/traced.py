"""Run the tunnel's server or agent with a timestamp at each point a request passes.

``SIGUSR1`` starts recording; ``SIGUSR2`` stops it, writes the records to
``--out`` (whole, by a rename) and forgets them, for the next SIGUSR1. A
record is a line ``<CLOCK_MONOTONIC ns> <point>``: the clock every process on
the machine shares, so :mod:`bench.bench_latency_path` can put the server's
and the agent's records on one time line. The program runs as it would on its
own (see :mod:`bench.program`)::

    python -m bench.traced --out server.trace -- /venv/bin/tunnel-server serve ...

The points, each the first line of the method named (a program records only
the points its own code passes):

==============  ===========================================================
caller_in       ``FrontDoor.data_received``: bytes from a kubectl caller
caller_out      ``FrontDoor._write`` / ``_writelines``: the answer written
tunnel_send     ``WebSocketTransport.send`` called with a message
tunnel_sent     ``WebSocketTransport.send`` returned (the message written)
tunnel_recv     ``WebSocketTransport.receive`` returned a message
upstream_out    a write to an ``UpstreamConnection``'s transport: the request to the API server
upstream_in     ``UpstreamConnection.data_received``: the API server answers
==============  ===========================================================

A record costs about half a microsecond, at most :data:`MAX_RECORDS` are kept
per recording, and the methods are wrapped before the program starts.

The request path is compiled with mypyc (setup.py): a compiled method calls
another of its class directly, past anything set on the class. So a point is
marked where a method is looked up by name: the event loop calls a protocol's
``data_received`` and ``connection_made`` so, and the front door hands its
``_write`` and ``_writelines`` to the answer's buffer as bound methods (an
answer written by a direct call, a refusal's, is not marked). The upstream
request is marked by the transport its connection writes it to.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from types import FrameType
from typing import Any

from .program import parse_wrapping, run_program

__all__ = ["MAX_RECORDS", "POINTS", "main"]

POINTS = (
    "caller_in",
    "caller_out",
    "tunnel_send",
    "tunnel_sent",
    "tunnel_recv",
    "upstream_out",
    "upstream_in",
)
MAX_RECORDS = 2_000_000


class _Recorder:
    def __init__(self) -> None:
        self.on = False
        self.records: list[tuple[int, str]] = []

    def mark(self, point: str) -> None:
        if self.on and len(self.records) < MAX_RECORDS:
            self.records.append((time.monotonic_ns(), point))

    def write(self, path: str) -> None:
        with open(path + ".partial", "w") as out:
            out.writelines(f"{when} {point}\n" for when, point in self.records)
        os.replace(path + ".partial", path)
        self.records = []


def _before(recorder: _Recorder, cls: type, name: str, point: str) -> None:
    original: Callable[..., Any] = getattr(cls, name)

    @functools.wraps(original)
    def marked(self: object, *args: Any) -> Any:
        recorder.mark(point)
        return original(self, *args)

    setattr(cls, name, marked)


class _MarkedWrites:
    """A transport whose writes are marked; everything else is the transport's own."""

    def __init__(self, transport: Any, recorder: _Recorder, point: str) -> None:
        self._transport = transport
        self._recorder = recorder
        self._point = point

    def write(self, data: bytes) -> None:
        self._recorder.mark(self._point)
        self._transport.write(data)

    def writelines(self, parts: Any) -> None:
        self._recorder.mark(self._point)
        self._transport.writelines(parts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _writes_marked(recorder: _Recorder, cls: type, point: str) -> None:
    """Mark every write of ``cls``'s connections: they get their transport wrapped."""
    original: Callable[[Any, Any], None] = getattr(cls, "connection_made")  # noqa: B009

    @functools.wraps(original)
    def made(self: object, transport: Any) -> None:
        original(self, _MarkedWrites(transport, recorder, point))

    setattr(cls, "connection_made", made)  # noqa: B010


def _install(recorder: _Recorder) -> None:
    from tunnel_agent.upstream_connection import UpstreamConnection
    from tunnel_mux.websocket import WebSocketTransport
    from tunnel_server.edge.frontdoor import FrontDoor

    _before(recorder, FrontDoor, "data_received", "caller_in")
    _before(recorder, FrontDoor, "_write", "caller_out")
    _before(recorder, FrontDoor, "_writelines", "caller_out")
    _writes_marked(recorder, UpstreamConnection, "upstream_out")
    _before(recorder, UpstreamConnection, "data_received", "upstream_in")
    send: Callable[[WebSocketTransport, bytes], Awaitable[None]] = WebSocketTransport.send
    receive: Callable[[WebSocketTransport], Awaitable[bytes]] = WebSocketTransport.receive

    async def marked_send(self: WebSocketTransport, message: bytes) -> None:
        recorder.mark("tunnel_send")
        await send(self, message)
        recorder.mark("tunnel_sent")

    async def marked_receive(self: WebSocketTransport) -> bytes:
        message = await receive(self)
        recorder.mark("tunnel_recv")
        return message

    WebSocketTransport.send = marked_send  # type: ignore[method-assign]
    WebSocketTransport.receive = marked_receive  # type: ignore[method-assign]


def main(argv: Sequence[str] | None = None) -> None:
    wrapping = parse_wrapping(
        "python -m bench.traced", __doc__, "where SIGUSR2 writes the records", argv
    )
    recorder = _Recorder()
    _install(recorder)

    def start(signum: int, frame: FrameType | None) -> None:
        recorder.on = True

    def stop(signum: int, frame: FrameType | None) -> None:
        recorder.on = False
        recorder.write(wrapping.out)

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    run_program(wrapping.parser, wrapping.command)


if __name__ == "__main__":
    main()
