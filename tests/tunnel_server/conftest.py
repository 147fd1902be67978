"""The TLS listener's tests also run on uvloop, the loop the server picks.

They drive sockets below asyncio's streams (readers on raw descriptors, a
handshake cancelled half-way), where the two loops differ. The rest of this
directory runs on asyncio's loop alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest

from tests.both_loops import pytest_asyncio_loop_factories as both_loops

ON_BOTH_LOOPS = {"test_listener.py"}


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    if item.path.name in ON_BOTH_LOOPS:
        return both_loops(config, item)
    return {"asyncio": asyncio.new_event_loop}


def pytest_itemcollected(item: pytest.Item) -> None:
    if item.path.name in ON_BOTH_LOOPS:
        item.add_marker(pytest.mark.timeout(120, method="thread"))


__all__ = ["pytest_asyncio_loop_factories", "pytest_itemcollected"]
