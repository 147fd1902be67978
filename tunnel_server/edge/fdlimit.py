"""The server's file descriptor limit, raised to what the system allows.

Every connection costs the server a descriptor: callers' (up to
``--max-caller-connections``), those not through their TLS handshake yet (up
to ``max_tls_held``), one per agent, and a few for the store. Many setups
start a process with a soft limit of 1024 (systemd services, some container
runtimes) under a far higher hard one. The soft limit is raised to the hard
one at start, as Go's runtime does for every program since Go 1.19, and the
log says when even that is below what the server's bounds may use.
"""

from __future__ import annotations

import logging
import resource

__all__ = ["raise_file_limit"]

logger = logging.getLogger(__name__)

#: Descriptors the server uses besides connections: the store, logs, the loop.
SPARE_DESCRIPTORS = 256


def raise_file_limit(connections: int) -> int:
    """Raise the soft limit to the hard one; warn if below ``connections`` and spares.

    Returns the soft limit now in force.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:  # an infinite hard limit above the kernel's
            logger.debug("cannot raise the file descriptor limit to %s: %s", hard, exc)
    needed = connections + SPARE_DESCRIPTORS
    if soft != resource.RLIM_INFINITY and soft < needed:
        logger.warning(
            "the file descriptor limit is %d, and the server's connection bounds may need %d:"
            " raise it (ulimit -n, or the container runtime's nofile) or lower"
            " --max-caller-connections; past it, new connections wait in the listen queue",
            soft,
            needed,
        )
    return soft
