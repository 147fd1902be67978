"""Command-line plumbing shared by tunnel-server, tunnel-agent and tunnelctl.

Flags that also read environment variables, durations, logging set-up
(text for people, JSON for machines), text from outside made safe to show,
freezing start-up objects out of
the garbage collector's full passes, and the choice of event loop (uvloop
when installed). Depends on the standard library only (uvloop is imported
by name, when present).
"""

from .eventloop import EVENT_LOOPS, loop_factory, run_main
from .flags import FlagError, describe_duration, env_flag, parse_duration
from .logs import configure_logging
from .memory import freeze_startup_objects
from .text import printable, printable_line

__all__ = [
    "EVENT_LOOPS",
    "FlagError",
    "configure_logging",
    "describe_duration",
    "env_flag",
    "freeze_startup_objects",
    "loop_factory",
    "parse_duration",
    "printable",
    "printable_line",
    "run_main",
]
