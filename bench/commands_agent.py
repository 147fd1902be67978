"""The command benchmark's agents: several real agents in one process, trivial jobs.

Each agent is wired as :func:`tunnel_agent.cli.run_agent` wires it (an
:class:`~tunnel_agent.connector.Agent`, a :class:`~tunnel_agent.router.StreamRouter`
and a :class:`~tunnel_agent.runner.CommandRunner` with its journal in the
credentials directory), except that the executor returns success at once, so
the benchmark measures dispatch rather than the Kubernetes API. The spec is
still validated by the product's :func:`tunnel_agent.commands.validate_spec`.

The process reports on stdout, one line per event, for the benchmark to read:

    C CLUSTER                   the agent's session is up
    D CLUSTER                   the agent's session ended
    S CLUSTER NAME ID TIME      a job started (TIME is time.time() as the executor began)
    A ID TIME                   the server acknowledged the job's result

    python -m bench.commands_agent --server URL --ca FILE --agents FILE.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from protocol import kinds
from tunnel_agent.commands import validate_spec
from tunnel_agent.config import AgentSettings, ConnectSettings
from tunnel_agent.connector import Agent
from tunnel_agent.credentials import DirectoryCredentialStore
from tunnel_agent.journal import Journal, JournalBackend
from tunnel_agent.router import StreamRouter
from tunnel_agent.runner import CommandRunner, Executor, JobContext, RunnerSettings
from tunnel_cli import configure_logging
from tunnel_mux import Session

__all__ = ["main"]


class Events:
    """Event lines for the benchmark, written without blocking, once per event-loop turn."""

    def __init__(self, transport: asyncio.WriteTransport) -> None:
        self._transport = transport
        self._lines: list[str] = []
        self._scheduled = False

    @classmethod
    async def on_stdout(cls) -> Events:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.connect_write_pipe(asyncio.Protocol, sys.stdout.buffer)
        return cls(transport)

    def emit(self, line: str) -> None:
        self._lines.append(line)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        data, self._lines = "".join(f"{line}\n" for line in self._lines), []
        self._transport.write(data.encode())


class AckJournal(Journal):
    """The product's journal, which also says when the server acknowledged a result."""

    def __init__(self, backend: JournalBackend, events: Events) -> None:
        super().__init__(backend)
        self._events = events

    def acknowledged(self, command_id: str, attempt: int) -> None:
        super().acknowledged(command_id, attempt)
        self._events.emit(f"A {command_id} {time.time():.6f}")


def trivial_executor(cluster: str, events: Events) -> Executor:
    """An executor that records when it starts and succeeds at once."""

    async def execute(spec: dict[str, Any], job: JobContext) -> dict[str, Any]:
        started = time.time()
        events.emit(f"S {cluster} {spec['name']} {job.command_id} {started:.6f}")
        return {"outcome": "succeeded", "summary": {"started": started}, "outputs": []}

    return execute


async def run_one(
    entry: dict[str, Any], args: argparse.Namespace, ca_pem: bytes, events: Events
) -> None:
    """One agent, wired as ``tunnel-agent run`` wires it, until cancelled."""
    cluster = str(entry["cluster"])
    directory = Path(entry["credentials_dir"])
    store = DirectoryCredentialStore(directory)
    runner = CommandRunner(
        trivial_executor(cluster, events),
        validate_spec,
        AckJournal(store, events),
        RunnerSettings(concurrency=args.concurrency, workroot=Path(args.workroot)),
    )
    router = StreamRouter()
    router.add(kinds.STREAM_COMMAND, runner.handle_offer)

    def connected(session: Session) -> None:
        runner.connected(session)
        events.emit(f"C {cluster}")

    def disconnected() -> None:
        runner.disconnected()
        events.emit(f"D {cluster}")

    settings = AgentSettings(
        server_url=args.server,
        ca_pem=ca_pem,
        cluster=cluster,
        bootstrap_token=entry.get("bootstrap_token") or None,
        credentials_dir=directory,
        commands_concurrency=args.concurrency,
        connect=ConnectSettings(backoff_base=0.2, backoff_cap=2.0),
    )
    agent = Agent(
        settings,
        store,
        on_stream=router,
        on_message=runner.on_message,
        on_connected=connected,
        on_disconnected=disconnected,
    )
    tasks = [
        asyncio.create_task(agent.run(), name=f"agent {cluster}"),
        asyncio.create_task(runner.run(), name=f"runner {cluster}"),
    ]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()  # re-raises why the agent or runner stopped
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def run(args: argparse.Namespace, entries: list[dict[str, Any]], ca_pem: bytes) -> None:
    """Run every agent of ``entries`` until SIGTERM or SIGINT."""
    events = await Events.on_stdout()
    main = asyncio.create_task(_all(entries, args, ca_pem, events), name="agents")
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, main.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await main


async def _all(
    entries: list[dict[str, Any]], args: argparse.Namespace, ca_pem: bytes, events: Events
) -> None:
    async with asyncio.TaskGroup() as group:
        for entry in entries:
            group.create_task(run_one(entry, args, ca_pem, events))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.commands_agent", description=__doc__)
    parser.add_argument("--server", required=True, help="https://HOST:PORT of the tunnel server")
    parser.add_argument("--ca", required=True, help="the server's CA bundle (PEM file)")
    parser.add_argument(
        "--agents", required=True, help="JSON list of {cluster, credentials_dir, bootstrap_token}"
    )
    parser.add_argument("--concurrency", type=int, default=8, help="jobs each agent runs at once")
    parser.add_argument("--workroot", required=True, help="where jobs' work directories go")
    parser.add_argument("--log-level", default="info", help="log level (the product's default)")
    args = parser.parse_args(argv)
    configure_logging("text", args.log_level)  # as tunnel-agent does; stderr goes to a file
    entries: list[dict[str, Any]] = json.loads(Path(args.agents).read_text())
    asyncio.run(run(args, entries, Path(args.ca).read_bytes()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
