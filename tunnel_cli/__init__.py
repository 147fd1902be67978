"""Command-line plumbing shared by tunnel-server, tunnel-agent and tunnelctl.

Flags that also read environment variables, durations, and logging set-up
(text for people, JSON for machines). Depends on the standard library only.
"""

from .flags import FlagError, env_flag, parse_duration
from .logs import configure_logging

__all__ = ["FlagError", "configure_logging", "env_flag", "parse_duration"]
