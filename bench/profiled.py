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

import argparse
import cProfile
import os
import signal
from collections.abc import Sequence
from types import FrameType

from .program import command_of, run_program

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.profiled", description=__doc__)
    parser.add_argument("--out", required=True, help="where SIGUSR2 writes the statistics")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND LINE")
    args = parser.parse_args(argv)
    command = command_of(parser, args.command)
    profiler = cProfile.Profile()

    def start(signum: int, frame: FrameType | None) -> None:
        profiler.enable()

    def stop(signum: int, frame: FrameType | None) -> None:
        profiler.disable()
        # Whole or not at all: a reader polling for the file never sees half of it.
        profiler.dump_stats(args.out + ".partial")
        os.replace(args.out + ".partial", args.out)
        profiler.clear()

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    run_program(parser, command)


if __name__ == "__main__":
    main()
