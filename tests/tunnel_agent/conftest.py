"""The agent's tests run on asyncio's event loop and on uvloop's.

tunnel-agent runs on uvloop when it is installed (tunnel_cli.eventloop), and
uvloop differs where the agent leans on the loop: subprocesses and their
output channels (the executors), timers, transports.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest
import uvloop


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


def pytest_itemcollected(item: pytest.Item) -> None:
    # On uvloop a test that fails with a handle left open can hang inside
    # loop.close() (a ResourceWarning raised as an error there), where the
    # default signal-based timeout cannot reach: the thread method ends the run
    # with every stack printed instead of hanging it.
    item.add_marker(pytest.mark.timeout(120, method="thread"))
