"""The end-to-end tests that drive the server and agent in this process run twice:
on asyncio's event loop and on uvloop's (test_cli_e2e.py starts the real
commands, which pick uvloop themselves).

The commands run on uvloop when it is installed (tunnel_cli.eventloop), and
uvloop's transports and servers are not subclasses of asyncio's: code that
checks ``isinstance(transport, asyncio.Transport)`` works on one loop and not
the other. Running kubectl's whole repertoire (watch, logs -f, exec,
port-forward ...) on both catches that.
"""

from __future__ import annotations

from tests.both_loops import *  # noqa: F403 - the hooks that run each test on both loops
