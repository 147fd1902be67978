"""Conftest hooks that run a test directory's tests on asyncio's loop and on uvloop's.

A conftest takes them with ``from tests.both_loops import *``: each test runs
once per loop, and on uvloop with the thread timeout, because a test that fails
with a handle left open can hang inside loop.close() (a ResourceWarning raised
as an error there), where the default signal-based timeout cannot reach: the
thread method ends the run with every stack printed instead of hanging it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest
import uvloop

__all__ = ["pytest_asyncio_loop_factories", "pytest_itemcollected"]


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


def pytest_itemcollected(item: pytest.Item) -> None:
    item.add_marker(pytest.mark.timeout(120, method="thread"))
