"""The command benchmark's baseline: what HTTP and one durable SQLite insert cost alone.

A trivial aiohttp server on the tunnel server's own TLS certificate and
settings (:func:`tunnel_pki.tls.server_context`) whose one endpoint,
``POST /commands``, reads the JSON body and inserts it as one row, committed,
into a SQLite file in WAL mode with ``synchronous=NORMAL``; like the product's
store, the database work runs on one dedicated thread. It answers 201 with the
row's id. No authentication, no dispatch, no agent.

    python -m bench.commands_baseline --port PORT --state-dir DIR --db FILE
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sqlite3
import sys
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

from aiohttp import web

from tunnel_pki.tls import server_context

__all__ = ["main"]

_MAX_BODY = 1024 * 1024
_DB: web.AppKey[sqlite3.Connection] = web.AppKey("db", sqlite3.Connection)
_THREAD: web.AppKey[ThreadPoolExecutor] = web.AppKey("thread", ThreadPoolExecutor)


def _connect(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA busy_timeout = 5000")
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = NORMAL")
    db.execute(
        "CREATE TABLE IF NOT EXISTS commands (id TEXT PRIMARY KEY, cluster TEXT NOT NULL,"
        " spec TEXT NOT NULL, state TEXT NOT NULL, created_at TEXT NOT NULL)"
    )
    return db


def _insert(db: sqlite3.Connection, cluster: str, spec: str) -> str:
    command_id = str(uuid.uuid4())
    db.execute("BEGIN IMMEDIATE")
    db.execute(
        "INSERT INTO commands (id, cluster, spec, state, created_at)"
        " VALUES (?, ?, ?, 'pending', ?)",
        (command_id, cluster, spec, datetime.now(UTC).isoformat(timespec="microseconds")),
    )
    db.execute("COMMIT")
    return command_id


async def submit(request: web.Request) -> web.Response:
    body = await request.content.read(_MAX_BODY + 1)
    if len(body) > _MAX_BODY:
        raise web.HTTPRequestEntityTooLarge(max_size=_MAX_BODY, actual_size=len(body))
    try:
        document = json.loads(body)
    except ValueError as exc:
        raise web.HTTPBadRequest(text="not JSON") from exc
    spec = document.get("spec") if isinstance(document, dict) else None
    if not isinstance(spec, dict):
        raise web.HTTPBadRequest(text="no spec")
    loop = asyncio.get_running_loop()
    command_id = await loop.run_in_executor(
        request.app[_THREAD],
        _insert,
        request.app[_DB],
        request.match_info["cluster"],
        json.dumps(spec),
    )
    return web.json_response({"id": command_id, "state": "pending"}, status=201)


async def run(args: argparse.Namespace) -> None:
    state = Path(args.state_dir)
    context = server_context(
        (state / "server.crt").read_bytes(),
        (state / "server.key").read_bytes(),
        (state / "ca.crt").read_bytes(),
    )
    thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite")
    app = web.Application(client_max_size=_MAX_BODY)
    app[_THREAD] = thread
    app[_DB] = await asyncio.get_running_loop().run_in_executor(thread, _connect, args.db)
    app.router.add_post("/clusters/{cluster}/commands", submit)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", args.port, ssl_context=context, backlog=1024)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
        thread.submit(app[_DB].close).result()
        thread.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.commands_baseline", description=__doc__)
    parser.add_argument("--port", type=int, required=True, help="port on 127.0.0.1")
    parser.add_argument("--state-dir", required=True, help="the tunnel server's state directory")
    parser.add_argument("--db", required=True, help="the SQLite file")
    asyncio.run(run(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
