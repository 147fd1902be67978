"""Container logs: lines tests append, served by ``GET .../pods/NAME/log`` as a kubelet would.

Each container of each pod (keyed by the pod's uid, so a recreated pod starts
empty) has a bounded list of timestamped lines. ``follow=true`` streams new
lines as they are appended until the container's log is closed, the pod is
deleted or the client goes away; ``tailLines``, ``sinceSeconds``,
``sinceTime``, ``timestamps`` and ``limitBytes`` behave as on a real cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web

from tests.kubestub.status import bad_request

__all__ = ["LogBook", "LogLine", "format_timestamp", "pick_container", "serve_log"]


@dataclass(frozen=True, slots=True)
class LogLine:
    """One line of a container's output (without its newline)."""

    time: datetime
    text: str


@dataclass(slots=True)
class _ContainerLog:
    lines: deque[LogLine]
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    closed: bool = False
    dropped: int = 0  # lines pushed out of the bound, so followers can keep their place

    def notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


def format_timestamp(moment: datetime) -> str:
    """RFC 3339 with nanoseconds, as the kubelet prefixes lines with ``timestamps=true``."""
    moment = moment.astimezone(UTC)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{moment.microsecond:06d}000Z"


class LogBook:
    """Every container's log lines, bounded per container."""

    def __init__(self, max_lines: int = 10_000) -> None:
        if max_lines < 1:
            raise ValueError("max_lines must be positive")
        self._max_lines = max_lines
        self._logs: dict[tuple[str, str], _ContainerLog] = {}

    def _log(self, uid: str, container: str) -> _ContainerLog:
        log = self._logs.get((uid, container))
        if log is None:
            log = _ContainerLog(deque(maxlen=self._max_lines))
            self._logs[(uid, container)] = log
        return log

    def append(self, uid: str, container: str, text: str, *, time: datetime | None = None) -> None:
        """Append ``text`` (one line per newline in it) to a container's log."""
        log = self._log(uid, container)
        moment = time or datetime.now(UTC)
        for line in text.split("\n"):
            if len(log.lines) == log.lines.maxlen:
                log.dropped += 1
            log.lines.append(LogLine(moment, line))
        log.notify()

    def lines(self, uid: str, container: str) -> list[LogLine]:
        """The lines kept for a container, oldest first."""
        log = self._logs.get((uid, container))
        return list(log.lines) if log else []

    def close(self, uid: str, container: str | None = None) -> None:
        """The container stopped: followers get the rest and their stream ends."""
        for (pod, name), log in self._logs.items():
            if pod == uid and container in (None, name):
                log.closed = True
                log.notify()
        if container is not None:
            self._log(uid, container).closed = True

    def close_all(self) -> None:
        """End every follower (the server is stopping)."""
        for log in self._logs.values():
            log.closed = True
            log.notify()

    def forget(self, uid: str) -> None:
        """The pod is gone: end its followers and drop its lines."""
        for key in [key for key in self._logs if key[0] == uid]:
            log = self._logs.pop(key)
            log.closed = True
            log.notify()

    async def follow(
        self, uid: str, container: str, position: int
    ) -> tuple[list[LogLine], int, bool]:
        """Wait for lines after absolute ``position``; return (lines, new position, ended)."""
        log = self._log(uid, container)
        while True:
            end = log.dropped + len(log.lines)
            if end > position:
                start = max(position - log.dropped, 0)
                return list(log.lines)[start:], end, False
            if log.closed or (uid, container) not in self._logs:
                return [], position, True
            await log.changed.wait()

    def position(self, uid: str, container: str) -> int:
        """The absolute index just past the last line (for following from now)."""
        log = self._log(uid, container)
        return log.dropped + len(log.lines)


def pick_container(pod: dict[str, Any], wanted: str | None) -> str:
    """The container a log or exec request means, with the server's 400s when it is unclear."""
    name = pod["metadata"]["name"]
    containers = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
    if wanted:
        if wanted not in containers:
            raise bad_request(f"container {wanted} is not valid for pod {name}")
        return wanted
    if len(containers) == 1:
        return str(containers[0])
    raise bad_request(
        f"a container name must be specified for pod {name}, choose one of: "
        f"[{' '.join(str(c) for c in containers)}]"
    )


def _int_param(request: web.Request, name: str) -> int | None:
    value = request.query.get(name)
    if value is None or value == "":
        return None
    try:
        number = int(value)
    except ValueError as exc:
        raise bad_request(f"{name}: Invalid value: {value!r}: must be an integer") from exc
    if number < 0:
        raise bad_request(f"{name}: Invalid value: {number}: must be greater than or equal to 0")
    return number


async def serve_log(request: web.Request, book: LogBook, pod: dict[str, Any]) -> web.StreamResponse:
    """Answer ``GET .../pods/NAME/log`` for ``pod``."""
    query = request.query
    container = pick_container(pod, query.get("container"))
    uid = pod["metadata"]["uid"]
    if query.get("previous", "").lower() in ("true", "1"):
        raise bad_request(
            f'previous terminated container "{container}" in pod "{pod["metadata"]["name"]}" '
            "not found"
        )
    follow = query.get("follow", "").lower() in ("true", "1")
    timestamps = query.get("timestamps", "").lower() in ("true", "1")
    tail = _int_param(request, "tailLines")
    since_seconds = _int_param(request, "sinceSeconds")
    limit_bytes = _int_param(request, "limitBytes")
    since: datetime | None = None
    if since_seconds is not None:
        since = datetime.now(UTC) - timedelta(seconds=since_seconds)
    elif query.get("sinceTime"):
        try:
            since = datetime.fromisoformat(query["sinceTime"].replace("Z", "+00:00"))
        except ValueError as exc:
            raise bad_request(f"sinceTime: Invalid value: {query['sinceTime']!r}") from exc
    position = book.position(uid, container)
    lines = book.lines(uid, container)
    if since is not None:
        lines = [line for line in lines if line.time >= since]
    if tail is not None:
        lines = lines[-tail:] if tail else []
    response = web.StreamResponse(headers={"Content-Type": "text/plain"})
    response.enable_chunked_encoding()
    await response.prepare(request)
    budget = [limit_bytes]

    async def send(batch: list[LogLine]) -> bool:
        if not batch:
            return True
        data = b"".join(
            ((format_timestamp(line.time) + " ") if timestamps else "").encode()
            + line.text.encode()
            + b"\n"
            for line in batch
        )
        if budget[0] is not None:
            data = data[: budget[0]]
            budget[0] -= len(data)
        await response.write(data)
        return budget[0] is None or budget[0] > 0

    with contextlib.suppress(ConnectionResetError):
        going = await send(lines)
        while follow and going:
            batch, position, ended = await book.follow(uid, container, position)
            going = await send(batch) and not ended
        await response.write_eof()
    return response
