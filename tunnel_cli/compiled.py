"""Whether this installation runs the request path compiled (mypyc) or interpreted.

setup.py compiles the protocol and the proxies' hot modules where a C
compiler and Python's headers exist; elsewhere the same sources run
interpreted, correct but with more CPU per proxied request. Both commands
say at start which it is, since pip does not show what a build printed.
"""

from __future__ import annotations

from importlib.machinery import EXTENSION_SUFFIXES

import protocol.connection

__all__ = ["request_path_build"]


def request_path_build() -> str:
    """``compiled`` or ``interpreted``, with what to do about the latter."""
    if protocol.connection.__file__.endswith(tuple(EXTENSION_SUFFIXES)):
        return "compiled (mypyc)"
    return (
        "interpreted (installed without a C compiler and Python's headers, or with "
        "TUNNEL_PURE_PYTHON=1: more CPU per proxied request; reinstall where both exist "
        "to compile it)"
    )
