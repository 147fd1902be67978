"""The agent worker processes: many agents (or plain WebSockets) in one process.

A worker (``--role worker``) runs its share of the fleet: real
``tunnel_agent.connector.Agent`` objects, each with its own mTLS WebSocket and
credentials directory, or, for the baseline, one plain TLS WebSocket per
agent certificate. It records from the agents' own events when each
connected, every retry and every 503 + Retry-After, and answers the
orchestrator's JSON lines on stdin (``status``, ``mark``, ``times``,
``stop``). :class:`Worker` is the orchestrator's end of that pipe.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import random
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

from protocol import Limits
from tunnel_agent.backoff import Backoff
from tunnel_agent.config import AgentSettings, ConnectSettings
from tunnel_agent.connector import Agent
from tunnel_agent.credentials import DirectoryCredentialStore
from tunnel_agent.errors import AgentError, ConnectError
from tunnel_pki.tls import client_context

from .idle_procs import MODULE, PIPE_LIMIT, BenchError, Children, memory_kib, raise_nofile

__all__ = ["Worker", "run_worker", "start_workers", "stop_workers", "wait_all_connected"]


# --------------------------------------------------------------- in the worker


class _Fleet:
    """What one worker's connections did, as their own events report it.

    Times are ``time.monotonic()``, which every process on the machine shares.
    An attempt starts when the back-off delay before it ends (or, the first
    time, when the agent starts), so attempt durations exclude the waiting.
    """

    def __init__(self, size: int, epoch: float) -> None:
        self.connected = 0
        self.sessions = 0
        self.attempt_started = [epoch] * size
        self.rss_before_kib = 0
        self.failures: list[str] = []
        self.mark()

    def mark(self) -> None:
        """From now on, count first connections, refusals and retries afresh."""
        self.connected_at: list[float | None] = [None] * len(self.attempt_started)
        self.refused = [0] * len(self.attempt_started)
        self.refused_at: list[float] = []
        self.refusal_seconds: list[float] = []
        self.attempt_seconds: list[float] = []
        self.retries = 0
        self.outcomes: Counter[str] = Counter()

    def on_connected(self, index: int) -> None:
        self.connected += 1
        self.sessions += 1
        if self.connected_at[index] is None:
            now = time.monotonic()
            self.connected_at[index] = now
            self.attempt_seconds.append(now - self.attempt_started[index])

    def on_disconnected(self) -> None:
        self.connected -= 1

    def on_retry(self, index: int, refused: bool, delay: float) -> None:
        now = time.monotonic()
        self.retries += 1
        if refused:
            self.refused[index] += 1
            self.refused_at.append(now)
            self.refusal_seconds.append(now - self.attempt_started[index])
        self.attempt_started[index] = now + delay

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        """Answer one command of the orchestrator."""
        command = request.get("cmd")
        if command == "status":
            return {
                "connected": self.connected,
                "done": sum(moment is not None for moment in self.connected_at),
                "sessions": self.sessions,
                "failures": self.failures[:3],
                "rss_before_kib": self.rss_before_kib,
            }
        if command == "mark":
            self.mark()
            return {"ok": True}
        if command == "times":
            return {
                "connected_at": self.connected_at,
                "refused": self.refused,
                "refused_at": self.refused_at,
                "refusal_seconds": self.refusal_seconds,
                "attempt_seconds": self.attempt_seconds,
                "retries": self.retries,
                "outcomes": dict(self.outcomes),
            }
        if command == "stop":
            return {"ok": True}
        return {"error": f"unknown command {command!r}"}


class _ConnectedFlag(asyncio.Event):
    """An agent's ``connected`` event that reports each change to the fleet."""

    def __init__(self, fleet: _Fleet, index: int) -> None:
        super().__init__()
        self._fleet = fleet
        self._index = index

    def set(self) -> None:
        if not self.is_set():
            self._fleet.on_connected(self._index)
        super().set()

    def clear(self) -> None:
        if self.is_set():
            self._fleet.on_disconnected()
        super().clear()


class _CountingBackoff(Backoff):
    """The agent's own back-off, counting its retries and the server's 503 answers."""

    __slots__ = ("_fleet", "_index")

    def __init__(
        self, fleet: _Fleet, index: int, *, base: float, cap: float, stable_after: float
    ) -> None:
        super().__init__(base=base, cap=cap, stable_after=stable_after)
        self._fleet = fleet
        self._index = index

    def next_delay(self, retry_after: float | None = None) -> float:
        delay = super().next_delay(retry_after)
        # Only a 503 + Retry-After carries a retry_after on the agent socket.
        self._fleet.on_retry(self._index, retry_after is not None, delay)
        return delay


class _Outcomes(logging.Handler):
    """Counts the agents' warnings by kind: why attempts failed, why sessions ended."""

    def __init__(self, fleet: _Fleet) -> None:
        super().__init__(logging.WARNING)
        self._fleet = fleet

    def emit(self, record: logging.LogRecord) -> None:
        self._fleet.outcomes[_outcome(record)] += 1


def _outcome(record: logging.LogRecord) -> str:
    args = record.args if isinstance(record.args, tuple) else ()
    error = args[0] if args else None
    if isinstance(error, ConnectError):
        if error.retry_after is not None:
            return "refused: 503 + Retry-After"
        what = str(error).split(": ")[0].split(" https://")[0]
        cause = error.__cause__
        return f"{what} ({type(cause).__name__})" if cause is not None else what
    return str(record.msg).split(":")[0][:60]


def _watch_agent_logs(fleet: _Fleet) -> None:
    errors = logging.StreamHandler(sys.stderr)
    errors.setLevel(logging.ERROR)
    errors.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(errors)
    logging.getLogger().setLevel(logging.ERROR)
    for name in ("tunnel_agent", "tunnel_mux"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.WARNING)
        logger.propagate = False
        logger.addHandler(_Outcomes(fleet))
        logger.addHandler(errors)


async def _run_agent(config: dict[str, Any], fleet: _Fleet, index: int, directory: Path) -> None:
    connect = ConnectSettings(
        backoff_base=float(config["backoff_base"]), backoff_cap=float(config["backoff_cap"])
    )
    settings = AgentSettings(
        server_url=str(config["url"]),
        ca_pem=(directory / "ca.crt").read_bytes(),
        cluster=directory.name,
        credentials_dir=directory,
        connect=connect,
    )
    backoff = _CountingBackoff(
        fleet,
        index,
        base=connect.backoff_base,
        cap=connect.backoff_cap,
        stable_after=connect.stable_after,
    )
    agent = Agent(settings, DirectoryCredentialStore(directory), backoff=backoff)
    agent.connected = _ConnectedFlag(fleet, index)
    fleet.attempt_started[index] = time.monotonic()
    try:
        await agent.run()
    except AgentError as exc:
        fleet.failures.append(f"{directory.name}: {exc}")


async def _run_plain(config: dict[str, Any], fleet: _Fleet, index: int, directory: Path) -> None:
    """The baseline client: one TLS WebSocket with the agent's certificate, nothing on top."""
    credentials = await DirectoryCredentialStore(directory).load()
    if credentials is None:
        fleet.failures.append(f"{directory.name}: no credentials")
        return
    context = client_context(
        credentials.ca_pem, cert_pem=credentials.cert_pem, key_pem=credentials.key_pem
    )
    flag = _ConnectedFlag(fleet, index)
    url = str(config["url"]) + "/ws"
    async with aiohttp.ClientSession() as http:
        while True:
            try:
                websocket = await http.ws_connect(
                    url,
                    ssl=context,
                    compress=0,
                    autoping=True,
                    heartbeat=None,
                    max_msg_size=Limits().message_limit,
                )
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                fleet.outcomes[f"plain: {type(exc).__name__}"] += 1
                await asyncio.sleep(random.uniform(0.0, 1.0))
                continue
            flag.set()
            try:
                async for _ in websocket:
                    pass
            finally:
                flag.clear()
                await websocket.close()


async def _serve_commands(fleet: _Fleet, stop: asyncio.Event) -> None:
    """Answer the orchestrator's JSON lines on stdin until ``stop`` or end of input."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=PIPE_LIMIT)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    try:
        while line := await reader.readline():
            request = json.loads(line)
            sys.stdout.write(json.dumps(fleet.answer(request)) + "\n")
            sys.stdout.flush()
            if request.get("cmd") == "stop":
                break
    finally:
        stop.set()  # the orchestrator asked, or is gone


async def run_worker(config: dict[str, Any]) -> int:
    raise_nofile()
    dirs = [Path(item) for item in config["dirs"]]
    fleet = _Fleet(len(dirs), float(config["epoch"]))
    _watch_agent_logs(fleet)
    fleet.rss_before_kib = memory_kib(os.getpid())["VmRSS"]
    run = _run_agent if config["mode"] == "agents" else _run_plain
    tasks = [asyncio.create_task(run(config, fleet, i, d)) for i, d in enumerate(dirs)]
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    commands = asyncio.create_task(_serve_commands(fleet, stop))
    try:
        await stop.wait()
    finally:
        for task in [*tasks, commands]:
            task.cancel()
        await asyncio.gather(*tasks, commands, return_exceptions=True)
    return 0


# ------------------------------------------------------------ in the orchestrator


class Worker:
    """One worker process, driven by JSON lines over its stdin and stdout."""

    def __init__(self, process: asyncio.subprocess.Process, size: int) -> None:
        self.process = process
        self.size = size
        self._lock = asyncio.Lock()

    async def ask(self, command: str, **fields: Any) -> dict[str, Any]:
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None
        assert stdout is not None
        async with self._lock:
            try:
                stdin.write(json.dumps({"cmd": command, **fields}).encode() + b"\n")
                await stdin.drain()
                line = await asyncio.wait_for(stdout.readline(), 60.0)
            except (ConnectionError, TimeoutError) as exc:
                raise BenchError(f"worker {self.process.pid} does not answer: {exc!r}") from exc
        if not line:
            raise BenchError(f"worker {self.process.pid} exited; see its log")
        answer: dict[str, Any] = json.loads(line)
        return answer


async def start_workers(
    args: argparse.Namespace,
    children: Children,
    dirs: list[Path],
    mode: str,
    url: str,
    run_dir: Path,
) -> list[Worker]:
    epoch = time.monotonic()
    per_worker = math.ceil(len(dirs) / args.processes)
    workers = []
    for number in range(args.processes):
        part = dirs[number * per_worker : (number + 1) * per_worker]
        if not part:
            break
        config = {
            "mode": mode,
            "url": url,
            "dirs": [str(d) for d in part],
            "epoch": epoch,
            "backoff_base": args.backoff_base,
            "backoff_cap": args.backoff_cap,
        }
        config_path = run_dir / f"{mode}-worker-{number}.json"
        config_path.write_text(json.dumps(config))
        argv = [sys.executable, "-m", MODULE, "--role", "worker", "--config", str(config_path)]
        process = await children.start(f"{mode}-worker-{number}", argv, stdin=True, stdout=True)
        workers.append(Worker(process, len(part)))
    return workers


async def wait_all_connected(workers: list[Worker], limit: float, label: str) -> float:
    """Wait until every connection of every worker is up (and new since the last mark)."""
    total = sum(worker.size for worker in workers)
    deadline = time.monotonic() + limit
    shown = time.monotonic()
    while True:
        statuses = await asyncio.gather(*(worker.ask("status") for worker in workers))
        failures = [failure for status in statuses for failure in status["failures"]]
        if failures:
            raise BenchError(f"{label}: agents stopped: {'; '.join(failures)}")
        done = sum(int(status["done"]) for status in statuses)
        connected = sum(int(status["connected"]) for status in statuses)
        now = time.monotonic()
        if done >= total and connected >= total:
            return now
        if now > deadline:
            raise BenchError(f"{label}: {connected} of {total} connected after {limit:.0f} s")
        if now - shown >= 5.0:
            print(f"  {label}: {connected} of {total} connected")
            shown = now
        await asyncio.sleep(0.2)


async def stop_workers(children: Children, workers: list[Worker]) -> None:
    for worker in workers:
        with contextlib.suppress(BenchError):
            await asyncio.wait_for(worker.ask("stop"), 5.0)
    await asyncio.gather(*(children.stop(worker.process) for worker in workers))
