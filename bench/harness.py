"""The frame of a benchmark that runs the tunnel's processes under a wrapper once, and reports.

It makes a run directory (kept with ``keep``, for the logs), installs the
load tools if missing, gives the measurement a :class:`Children` whose
processes all stop when it ends, turns a :class:`BenchError` into a message
and exit status 1, and reports the results (also as JSON, if asked).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from .procs import BenchError, Children
from .proxy_load import Target
from .proxy_setup import (
    Experiment,
    Tunnel,
    Upstream,
    ensure_tools,
    start_agent,
    start_server,
    start_upstream,
)

__all__ = ["run_measurement", "start_wrapped"]

T = TypeVar("T")


def run_measurement(
    name: str,
    keep: bool,
    measure: Callable[[Children, Path], Awaitable[T]],
    report: Callable[[T], None],
    json_out: Path | None,
) -> int:
    """Run ``measure(children, run_dir)`` and report it; the process's exit status.

    The results are also written to ``json_out`` as JSON when it is given.
    """
    run_dir = Path(tempfile.mkdtemp(prefix=f"{name.replace('_', '-')}-"))
    print(f"run directory (logs): {run_dir}", flush=True)
    try:
        ensure_tools(install=True, ssh=False)

        async def run() -> T:
            children = Children(run_dir)
            try:
                return await measure(children, run_dir)
            finally:
                await children.stop_all()

        results = asyncio.run(run())
    except BenchError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 1
    finally:
        if not keep:
            shutil.rmtree(run_dir, ignore_errors=True)
    report(results)
    if json_out is not None:
        json_out.write_text(json.dumps(results, indent=2))
    return 0


async def start_wrapped(
    children: Children, run_dir: Path, wrap: Callable[[str], list[str]]
) -> tuple[Tunnel, Upstream, Target]:
    """The upstream, and the real server and the benchmark's agent each under ``wrap(name)``.

    Also the target that reaches the upstream through them, with the user's token.
    """
    state = run_dir / "state"
    server, port = await start_server(children, state, "warning", Experiment(), wrap=wrap("server"))
    upstream = await start_upstream(children, state / "server.crt", state / "server.key")
    tunnel = await start_agent(
        children, run_dir, server, port, upstream.url, Experiment(), wrap=wrap("agent")
    )
    auth = (("Authorization", f"Bearer {tunnel.user_token}"),)
    return tunnel, upstream, Target("tunnel", tunnel.base, auth, tunnel.ca_file)
