"""Run a Python program with cProfile switched on and off by signals.

``SIGUSR1`` starts profiling the main thread (the event loop's), ``SIGUSR2``
stops it, writes the statistics to ``--out`` (at once, by a rename) and
forgets them, for the next SIGUSR1; another program reads the file with
:mod:`pstats`. So a benchmark can profile exactly the requests it
sends, not the start-up before them. The program runs as it would on its own
(``runpy``: ``__main__``, its own ``sys.argv``)::

    python -m bench.profiled --out server.prof -- /venv/bin/tunnel-server serve ...
    python -m bench.profiled --out agent.prof -- /venv/bin/python -m bench.proxy_agent ...

After ``--`` comes the command line the program would have had: a script, or
this Python interpreter with a script or ``-m MODULE``.
"""

from __future__ import annotations

import cProfile
import os
import signal
from collections.abc import Sequence
from types import FrameType

from .program import parse_wrapping, run_program

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> None:
    wrapping = parse_wrapping(
        "python -m bench.profiled", __doc__, "where SIGUSR2 writes the statistics", argv
    )
    profiler = cProfile.Profile()

    def start(signum: int, frame: FrameType | None) -> None:
        profiler.enable()

    def stop(signum: int, frame: FrameType | None) -> None:
        profiler.disable()
        # Whole or not at all: a reader polling for the file never sees half of it.
        profiler.dump_stats(wrapping.out + ".partial")
        os.replace(wrapping.out + ".partial", wrapping.out)
        profiler.clear()

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    run_program(wrapping.parser, wrapping.command)


if __name__ == "__main__":
    main()
