"""Compiles the request path with mypyc; everything else is in pyproject.toml.

The modules below handle every tunnel frame and every proxied request.
mypyc compiles them, as they are (typed, ``mypy --strict`` clean), to C
extensions: less CPU per proxied request on each relay (docs/architecture.md,
"Compiled where every request passes"). The Python sources stay the
reference: ``TUNNEL_PURE_PYTHON=1`` builds without a C compiler and runs the
same code interpreted.

A compiled coroutine never awaits in a ``finally`` or ``except`` block, nor
uses ``async with`` or ``async for`` (tests/test_compiled.py checks): mypyc 2.4
leaves the exception being raised as the thread's current exception when a
``finally`` block awaits, and later code raises it again. A compiled
dataclass made per request or frame defines its own ``__init__``
(``init=False``): the one ``dataclass()`` generates runs interpreted.

In a checkout, ``scripts/compiled.py`` builds them in place (again whenever
one changes; scripts/test and scripts/demo call it); a wheel (``pip wheel .``)
carries them compiled.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path

from setuptools import setup

#: The modules compiled. The error hierarchy (mypyc's exceptions cannot take a
#: class attribute default from a subclass), the access cache (tests replace
#: its methods), the command-line tools and everything that runs once per
#: connection or less stay interpreted.
COMPILED_MODULES = [
    "protocol/allowance.py",
    "protocol/checks.py",
    "protocol/connection.py",
    "protocol/events.py",
    "protocol/frames.py",
    "protocol/handlers.py",
    "protocol/handshake.py",
    "protocol/http.py",
    "protocol/kinds.py",
    "protocol/limits.py",
    "protocol/liveness.py",
    "protocol/outbox.py",
    "protocol/records.py",
    "protocol/sharing.py",
    "protocol/state.py",
    "protocol/streams.py",
    "tunnel_mux/session.py",
    "tunnel_mux/stream.py",
    "tunnel_mux/timer.py",
    "tunnel_kube/paths.py",
    "tunnel_kube/requests.py",
    "tunnel_kube/status.py",
    "tunnel_server/proxy/answer.py",
    "tunnel_server/edge/callerlimit.py",
    "tunnel_server/edge/frontdoor.py",
    "tunnel_server/edge/buffers.py",
    "tunnel_server/edge/http1.py",
    "tunnel_server/proxy/refusal.py",
    "tunnel_server/proxy/exchange.py",
    "tunnel_server/proxy/identity.py",
    "tunnel_server/proxy/request.py",
    "tunnel_agent/kubeproxy.py",
    "tunnel_agent/policy.py",
    "tunnel_agent/router.py",
    "tunnel_agent/upstream.py",
    "tunnel_agent/upstream_connection.py",
]


def missing_tool() -> str | None:
    """What this machine lacks to compile C extensions, or None."""
    if not any(shutil.which(name) for name in (os.environ.get("CC", "cc"), "gcc", "clang")):
        return "no C compiler (cc)"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        return "no Python headers (Python.h; Debian's python3-dev)"
    return None


def _ext_modules() -> list[object]:
    if os.environ.get("TUNNEL_PURE_PYTHON") == "1":
        return []
    lacking = missing_tool()
    if lacking is not None:
        # pip shows this only with -v; the installed package runs, slower.
        print(  # noqa: T201 - a build step's word to the person installing
            f"k8s-reverse-tunnel: {lacking}: installing the request path interpreted, "
            "which costs more CPU per proxied request (docs/architecture.md, "
            '"Compiled where every request passes")',
            file=sys.stderr,
        )
        return []
    from mypyc.build import mypycify

    return list(mypycify(COMPILED_MODULES, opt_level="3", group_name="protocol.compiled"))


if __name__ == "__main__":  # also how setuptools runs it; scripts/compiled.py reads the list
    setup(ext_modules=_ext_modules())
