"""Every end-to-end test runs twice: on asyncio's event loop and on uvloop's.

The commands run on uvloop when it is installed (tunnel_cli.eventloop), and
uvloop's transports and servers are not subclasses of asyncio's: code that
checks ``isinstance(transport, asyncio.Transport)`` works on one loop and not
the other. Running kubectl's whole repertoire (watch, logs -f, exec,
port-forward ...) on both catches that.
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
