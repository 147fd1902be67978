"""Log set-up: the level asked for, except where a library's debug output carries secrets."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from tunnel_cli.logs import QUIET_LIBRARIES, configure_logging


@pytest.fixture(autouse=True)
def restored() -> Iterator[None]:
    """The logging set-up as it was: these tests change the process's root logger."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    levels = {name: logging.getLogger(name).level for name in QUIET_LIBRARIES}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, value in levels.items():
        logging.getLogger(name).setLevel(value)


def test_at_debug_kubernetes_asyncio_never_logs_the_bodies_it_reads() -> None:
    stream = io.StringIO()
    configure_logging("text", "debug", stream)
    logging.getLogger("tunnel_agent").debug("ours")
    # What kubernetes_asyncio's REST client logs at debug: every answer's body.
    logging.getLogger("kubernetes_asyncio.client.rest").debug('response body: {"tls.key": "..."}')
    text = stream.getvalue()
    assert "ours" in text
    assert "tls.key" not in text


def test_above_info_the_libraries_follow_the_level_asked_for() -> None:
    configure_logging("text", "error", io.StringIO())
    assert all(logging.getLogger(name).level == logging.ERROR for name in QUIET_LIBRARIES)
