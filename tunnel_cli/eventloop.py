"""Which event loop the commands run on: uvloop's when it is installed, else asyncio's.

uvloop (libuv, with its TLS layer in Cython rather than asyncio's pure-Python
``sslproto``) cuts the server's CPU per proxied request by about a fifth and
lifts bulk throughput (docs/benchmarks.md, "Kubernetes API proxy"). ``auto``
takes it when it can be imported; ``asyncio`` forces the standard loop (the
tests run on it too); ``uvloop`` insists, and fails with a clear error if it
is missing.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from .flags import FlagError

__all__ = ["EVENT_LOOPS", "loop_factory", "run_main"]

T = TypeVar("T")

logger = logging.getLogger(__name__)

#: The choices of the ``--event-loop`` flag.
EVENT_LOOPS = ("auto", "uvloop", "asyncio")


def loop_factory(choice: str) -> tuple[str, Callable[[], asyncio.AbstractEventLoop]]:
    """The name of the loop ``choice`` gives here, and a factory of it."""
    if choice not in EVENT_LOOPS:
        raise FlagError(f"--event-loop must be one of {', '.join(EVENT_LOOPS)}, not {choice!r}")
    if choice != "asyncio":
        try:
            uvloop = importlib.import_module("uvloop")
        except ImportError as exc:
            if choice == "uvloop":
                raise FlagError(
                    "--event-loop uvloop: uvloop is not installed (pip install uvloop), "
                    "or choose auto or asyncio"
                ) from exc
        else:
            factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
            return "uvloop", factory
    return "asyncio", asyncio.new_event_loop


def run_main(main: Coroutine[Any, Any, T], choice: str = "auto") -> T:
    """Run ``main`` to its end on the loop ``choice`` gives (see :func:`loop_factory`)."""
    try:
        name, factory = loop_factory(choice)
    except FlagError:
        main.close()  # never awaited: say so quietly, not with a warning
        raise
    logger.info("event loop: %s", name)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
