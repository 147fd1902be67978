"""The proxy benchmark's watch client: N watches held open, then one event to each.

Run by the benchmark as ``python -m bench.proxy_watch URL --count N ...``. It
opens N connections (``--concurrency`` at a time), sends one watch GET on
each and waits for every response head (200, chunked). Then it prints one
JSON line, ``{"established": N, ...}``, and reads each watch's chunked body
until the first complete event line, noting the ``time.monotonic()`` of its
arrival (the clock is system-wide, so the benchmark compares it with the
moment it told the upstream to emit). When every watch has its event, or
when a line ``report`` arrives on stdin, it prints a second JSON line with
the arrival times; a line ``close`` (or end of input) closes every connection
and ends it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import ssl
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

__all__ = ["main"]

_MAX_CHUNK = 1024 * 1024


class _Watch:
    """One watch connection."""

    def __init__(self) -> None:
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.arrived: float | None = None
        self.error: str | None = None


async def _open(
    watch: _Watch,
    url: str,
    headers: list[str],
    context: ssl.SSLContext | None,
    limit: asyncio.Semaphore,
) -> None:
    split = urlsplit(url)
    host = split.hostname or "127.0.0.1"
    port = split.port or (443 if split.scheme == "https" else 80)
    target = split.path + (f"?{split.query}" if split.query else "")
    async with limit:
        try:
            reader, writer = await asyncio.open_connection(host, port, ssl=context)
            watch.reader, watch.writer = reader, writer
            request = [f"GET {target} HTTP/1.1", f"Host: {host}:{port}", "Accept: application/json"]
            writer.write(("\r\n".join([*request, *headers]) + "\r\n\r\n").encode())
            head = await reader.readuntil(b"\r\n\r\n")
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            watch.error = f"{type(exc).__name__}: {exc}"
            return
    status = head.split(b" ", 2)[1] if head.count(b" ") >= 2 else b"?"
    if status != b"200" or b"chunked" not in head.lower():
        watch.error = f"answer {head[:200]!r}"


async def _first_event(watch: _Watch) -> None:
    """Read the chunked body until one whole event line has arrived."""
    reader = watch.reader
    assert reader is not None
    data = b""
    try:
        while b"\n" not in data:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0 or size > _MAX_CHUNK:
                watch.error = f"the watch ended or sent a chunk of {size} bytes"
                return
            data += await reader.readexactly(size)
            await reader.readexactly(2)
    except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
        watch.error = f"{type(exc).__name__}: {exc}"
        return
    watch.arrived = time.monotonic()


def _emit(record: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


async def _commands() -> asyncio.Queue[str]:
    """Lines of stdin, as they come ("" at end of input)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    queue: asyncio.Queue[str] = asyncio.Queue()

    async def pump() -> None:
        while True:
            line = (await reader.readline()).decode()
            await queue.put(line.strip() if line else "")
            if not line:
                return

    task = asyncio.create_task(pump())
    _PUMPS.add(task)
    task.add_done_callback(_PUMPS.discard)
    return queue


_PUMPS: set[asyncio.Task[None]] = set()


async def run(args: argparse.Namespace) -> int:
    context: ssl.SSLContext | None = None
    if args.url.startswith("https"):
        context = ssl.create_default_context(cafile=args.cafile)
    commands = await _commands()
    watches = [_Watch() for _ in range(args.count)]
    limit = asyncio.Semaphore(args.concurrency)
    started = time.monotonic()
    await asyncio.gather(*(_open(w, args.url, args.header, context, limit) for w in watches))
    failed = [w.error for w in watches if w.error is not None]
    _emit(
        {
            "established": len(watches) - len(failed),
            "failed": len(failed),
            "errors": failed[:3],
            "seconds": time.monotonic() - started,
        }
    )
    try:
        last = None
        if not failed:
            readers = asyncio.gather(*(_first_event(w) for w in watches))
            command = asyncio.ensure_future(commands.get())
            waiting: set[asyncio.Future[Any]] = {readers, command}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if not readers.done():
                readers.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await readers
            arrivals = sorted(w.arrived for w in watches if w.arrived is not None)
            errors = [w.error for w in watches if w.error is not None]
            _emit(
                {
                    "received": len(arrivals),
                    "errors": errors[:3],
                    "first": arrivals[0] if arrivals else None,
                    "median": statistics.median(arrivals) if arrivals else None,
                    "p99": arrivals[int(0.99 * (len(arrivals) - 1))] if arrivals else None,
                    "last": arrivals[-1] if arrivals else None,
                }
            )
            if command.done():
                last = command.result()
            else:
                command.cancel()
        while last not in ("close", ""):
            last = await commands.get()
    finally:
        for watch in watches:
            if watch.writer is not None:
                watch.writer.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.proxy_watch", description=__doc__)
    parser.add_argument("url", help="the watch URL")
    parser.add_argument("--count", type=int, default=1000, help="watches to hold open")
    parser.add_argument("--concurrency", type=int, default=64, help="connections opened at once")
    parser.add_argument("--header", action="append", default=[], help="'Name: value' to send")
    parser.add_argument("--cafile", help="CA bundle for an https URL")
    args = parser.parse_args(argv)
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
