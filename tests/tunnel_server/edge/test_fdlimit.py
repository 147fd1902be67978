"""The server raises its file descriptor limit, and says when it is still too low."""

from __future__ import annotations

import resource
import subprocess
import sys
import textwrap


def run_with_soft_limit(soft: int, connections: int) -> subprocess.CompletedProcess[str]:
    """Start a Python process with this soft limit, then raise it as the server does."""
    script = textwrap.dedent(
        f"""
        import logging, resource
        logging.basicConfig(level=logging.WARNING, format="%(message)s")
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, hard))
        from tunnel_server.edge.fdlimit import raise_file_limit
        print(raise_file_limit({connections}), hard)
        """
    )
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )


def test_the_soft_limit_is_raised_to_the_hard_one() -> None:
    done = run_with_soft_limit(256, connections=100)
    now, hard = done.stdout.split()
    assert now == hard
    assert "file descriptor limit" not in done.stderr


def test_a_hard_limit_below_the_bounds_is_told() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    done = run_with_soft_limit(256, connections=hard)
    assert f"the file descriptor limit is {hard}" in done.stderr
    assert f"may need {hard + 256}" in done.stderr
