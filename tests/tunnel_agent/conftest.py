"""The agent's tests run on asyncio's event loop and on uvloop's.

tunnel-agent runs on uvloop when it is installed (tunnel_cli.eventloop), and
uvloop differs where the agent leans on the loop: subprocesses and their
output channels (the executors), timers, transports.
"""

from __future__ import annotations

from tests.both_loops import *  # noqa: F403 - the hooks that run each test on both loops
