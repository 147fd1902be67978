"""The command benchmark's client side: submitters, the agents' event lines, percentiles.

Every command gets a unique name (the spec's ``name``); the client records
``time.time()`` just before it sends the POST, and the agents report the
moment each job started under that name (:mod:`bench.commands_agent`), so a
command's dispatch latency is the difference, on one machine's clock.
"""

from __future__ import annotations

import asyncio
import math
import ssl
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from .commands_procs import BenchError

__all__ = [
    "AgentEvents",
    "Client",
    "Submission",
    "percentiles",
    "spec",
]

#: How long a sequential command may take to be acknowledged before the run fails.
ACK_PATIENCE = 15.0


def spec(name: str) -> dict[str, Any]:
    """A valid command (a query); the bench agents' executor answers it at once."""
    return {
        "apiVersion": "tunnel/v1",
        "type": "query",
        "name": name,
        "timeout": "1m",
        "spec": {"get": {"apiVersion": "v1", "kind": "Namespace", "name": "default"}},
    }


@dataclass(slots=True)
class Submission:
    """One POST: when it was sent and answered, and what it answered."""

    name: str
    cluster: str
    sent: float
    answered: float
    status: int


@dataclass
class AgentEvents:
    """What the agent processes said: sessions up, jobs started, results acknowledged."""

    connected: set[str] = field(default_factory=set)
    #: name -> (time.time() when the job started, command id, cluster)
    starts: dict[str, tuple[float, str, str]] = field(default_factory=dict)
    #: name -> time.time() when the server acknowledged the result
    acks: dict[str, float] = field(default_factory=dict)
    #: acknowledged results by name prefix (the name up to its last ``-``)
    acked: Counter[str] = field(default_factory=Counter)
    disconnects: int = 0
    _names: dict[str, str] = field(default_factory=dict)
    _waiting: dict[str, asyncio.Future[None]] = field(default_factory=dict)
    _change: asyncio.Event = field(default_factory=asyncio.Event)
    _readers: list[asyncio.Task[None]] = field(default_factory=list)

    def watch(self, process: asyncio.subprocess.Process) -> None:
        """Read ``process``'s event lines from now on, until it exits."""
        self._readers.append(asyncio.create_task(self._follow(process), name="agent events"))

    async def close(self) -> None:
        for task in self._readers:
            task.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)

    async def _follow(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        async for raw in process.stdout:
            self.feed(raw.decode().split())

    def feed(self, words: list[str]) -> None:
        kind = words[0] if words else ""
        if kind == "S":
            cluster, name, command_id, started = words[1:5]
            self.starts[name] = (float(started), command_id, cluster)
            self._names[command_id] = name
        elif kind == "A":
            name = self._names.get(words[1], "")
            self.acks[name] = float(words[2])
            self.acked[name.rpartition("-")[0]] += 1
            waiter = self._waiting.pop(name, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        elif kind == "C":
            self.connected.add(words[1])
        elif kind == "D":
            self.connected.discard(words[1])
            self.disconnects += 1
        self._change.set()

    def forget(self, clusters: Sequence[str]) -> None:
        """Count ``clusters`` as disconnected (their processes were stopped)."""
        self.connected.difference_update(clusters)

    def expect(self, name: str) -> asyncio.Future[None]:
        """A future that completes when ``name``'s result is acknowledged."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if name in self.acks:
            waiter.set_result(None)
        else:
            self._waiting[name] = waiter
        return waiter

    async def until(self, predicate: Any, within: float, what: str) -> None:
        """Wait until ``predicate()`` holds, or fail naming ``what``."""
        deadline = time.monotonic() + within
        while not predicate():
            self._change.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError(f"timed out after {within:.0f} s waiting for {what}")
            try:
                await asyncio.wait_for(self._change.wait(), min(left, 1.0))
            except TimeoutError:
                continue


class Client:
    """Submits commands over one aiohttp session, as a user's tooling would."""

    def __init__(
        self, base: str, path: str, token: str, context: ssl.SSLContext, connections: int
    ) -> None:
        self._base = base
        self._path = path  # with {cluster}
        self._headers = {"Authorization": f"Bearer {token}"}
        self._context = context
        self._connections = connections
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Client:
        connector = aiohttp.TCPConnector(limit=self._connections, ssl=self._context)
        self._http = aiohttp.ClientSession(connector=connector)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._http is not None:
            await self._http.close()

    async def submit(self, cluster: str, name: str) -> Submission:
        """POST one command; ``sent`` is time.time() just before the request goes out."""
        assert self._http is not None
        url = self._base + self._path.format(cluster=cluster)
        body = {"spec": spec(name)}
        sent = time.time()
        async with self._http.post(url, json=body, headers=self._headers) as answer:
            await answer.read()
            status = answer.status
        return Submission(name, cluster, sent, time.time(), status)

    async def sequential(
        self, clusters: Sequence[str], names: Sequence[str], events: AgentEvents | None
    ) -> list[Submission]:
        """One command at a time; with ``events``, each waits for its acknowledgement."""
        done: list[Submission] = []
        for number, name in enumerate(names):
            cluster = clusters[number % len(clusters)]
            waiter = events.expect(name) if events is not None else None
            submission = await self.submit(cluster, name)
            if submission.status != 201:
                raise BenchError(f"POST of {name} answered HTTP {submission.status}")
            if waiter is not None:
                try:
                    await asyncio.wait_for(waiter, ACK_PATIENCE)
                except TimeoutError as exc:
                    raise BenchError(
                        f"command {name} was not done within {ACK_PATIENCE:.0f} s"
                    ) from exc
            done.append(submission)
        return done

    async def flood(
        self, clusters: Sequence[str], prefix: str, submitters: int, duration: float
    ) -> tuple[float, list[Submission]]:
        """``submitters`` loops POSTing for ``duration`` s; returns the start and every POST."""
        done: list[Submission] = []
        counter = iter(range(1 << 40))
        start = time.time()
        until = start + duration

        async def submitter() -> None:
            while time.time() < until:
                number = next(counter)
                cluster = clusters[number % len(clusters)]
                done.append(await self.submit(cluster, f"{prefix}-{number}"))

        await asyncio.gather(*(submitter() for _ in range(submitters)))
        return start, done


def percentiles(
    values: Sequence[float], points: Sequence[float] = (50, 90, 99)
) -> dict[str, float]:
    """Nearest-rank percentiles, plus min, max and mean; empty input gives NaN."""
    ordered = sorted(values)
    if not ordered:
        return {"n": 0, **{f"p{p:g}": math.nan for p in points}, "max": math.nan}
    result: dict[str, float] = {"n": len(ordered), "min": ordered[0]}
    for point in points:
        rank = max(1, math.ceil(point / 100 * len(ordered)))
        result[f"p{point:g}"] = ordered[rank - 1]
    result["max"] = ordered[-1]
    result["mean"] = sum(ordered) / len(ordered)
    return result
