"""What both floor relays (:mod:`bench.relay_floor`, :mod:`bench.mux_floor`) share as processes:
their command line, and the signals that stop them.

The benchmark and the tests start either floor the same way::

    python -m bench.<floor> near --listen HOST:PORT --tunnel-listen HOST:PORT --cert C --key K
    python -m bench.<floor> far --tunnel HOST:PORT --ca CA --upstream HOST:PORT
"""

from __future__ import annotations

import argparse
import asyncio
import signal

__all__ = ["floor_parser", "stop_event"]


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"give HOST:PORT, not {text!r}")
    return host, int(port)


def floor_parser(prog: str, description: str | None) -> argparse.ArgumentParser:
    """The parser of a floor's two roles; ``args.role`` is ``near`` or ``far``."""
    parser = argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    roles = parser.add_subparsers(dest="role", required=True)
    near = roles.add_parser("near", help="the end clients and the far end connect to")
    near.add_argument("--listen", type=_address, required=True, help="HOST:PORT, clients")
    near.add_argument(
        "--tunnel-listen", type=_address, required=True, help="HOST:PORT, the far end"
    )
    near.add_argument("--cert", required=True, help="PEM certificate (chain), both ports")
    near.add_argument("--key", required=True, help="PEM key of --cert")
    far = roles.add_parser("far", help="the end that dials out and reaches the upstream")
    far.add_argument("--tunnel", type=_address, required=True, help="near's HOST:PORT")
    far.add_argument("--ca", required=True, help="PEM CA that signed near's certificate")
    far.add_argument("--upstream", type=_address, required=True, help="HOST:PORT, TCP")
    return parser


def stop_event() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT (call from the running loop)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    return stop
