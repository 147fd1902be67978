"""Command-line plumbing shared by tunnel-server, tunnel-agent and tunnelctl.

Flags that also read environment variables, durations, logging set-up
(text for people, JSON for machines), and freezing start-up objects out of
the garbage collector's full passes. Depends on the standard library only.
"""

from .flags import FlagError, env_flag, parse_duration
from .logs import configure_logging
from .memory import freeze_startup_objects

__all__ = [
    "FlagError",
    "configure_logging",
    "env_flag",
    "freeze_startup_objects",
    "parse_duration",
]
