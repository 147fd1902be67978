"""Command-line plumbing shared by tunnel-server, tunnel-agent and tunnelctl.

Flags that also read environment variables, durations, logging set-up
(text for people, JSON for machines), text from outside made safe to show,
freezing start-up objects out of the garbage collector's full passes, the
choice of event loop (uvloop when installed), and whether the request path
runs compiled. Depends on the standard library and ``protocol`` only (uvloop
is imported by name, when present).
"""

from .compiled import request_path_build
from .eventloop import EVENT_LOOPS, loop_factory, run_main
from .flags import FlagError, OnCommandLine, describe_duration, env_flag, parse_duration
from .logs import configure_logging
from .memory import freeze_startup_objects
from .text import printable, printable_line

__all__ = [
    "EVENT_LOOPS",
    "FlagError",
    "OnCommandLine",
    "configure_logging",
    "describe_duration",
    "env_flag",
    "freeze_startup_objects",
    "loop_factory",
    "parse_duration",
    "printable",
    "printable_line",
    "request_path_build",
    "run_main",
]
