"""An experiment: ``tunnel-server serve`` with other protocol limits.

The benchmark runs the real ``tunnel-server`` script. With ``--window``,
``--frame-size`` or ``--shared-window`` it runs this instead: the same parser,
settings and :func:`tunnel_server.app.run_server`, with the agent sockets'
:class:`protocol.Limits` changed (per-stream credit, connection credit,
largest frame, and the credit a stream keeps while the connection is shared),
to see what the defaults cost.

    python -m bench.proxy_server --initial-window BYTES --max-frame-size BYTES \
        --shared-window BYTES -- serve ...
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence

from protocol import Limits
from tunnel_cli import configure_logging, run_main
from tunnel_server.app import run_server
from tunnel_server.cli import build_parser, settings_from_args

__all__ = ["experiment_limits", "main"]


def experiment_limits(initial_window: int, max_frame_size: int, shared_window: int) -> Limits:
    """Default limits with these values (0: the default; connection credit at least 4 streams').

    A ``shared_window`` of at least the stream credit turns sharing off: every
    stream keeps the whole window, as before docs/protocol.md's "Sharing the
    connection".
    """
    default = Limits()
    return default.replace(
        initial_window=initial_window or default.initial_window,
        max_frame_size=max_frame_size or default.max_frame_size,
        connection_window=max(default.connection_window, 4 * (initial_window or 0)),
        shared_window=shared_window or default.shared_window,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.proxy_server", description=__doc__)
    parser.add_argument("--initial-window", type=int, default=0, help="per-stream credit")
    parser.add_argument("--max-frame-size", type=int, default=0, help="largest DATA frame")
    parser.add_argument("--shared-window", type=int, default=0, help="credit while shared")
    parser.add_argument("serve", nargs=argparse.REMAINDER, help="-- then tunnel-server arguments")
    args = parser.parse_args(argv)
    serve = args.serve[1:] if args.serve[:1] == ["--"] else args.serve
    server_args = build_parser().parse_args(serve)
    configure_logging(server_args.log_format, server_args.log_level)
    settings = settings_from_args(server_args)
    limits = experiment_limits(args.initial_window, args.max_frame_size, args.shared_window)
    tunnel = dataclasses.replace(settings.tunnel, limits=limits)
    run_main(run_server(dataclasses.replace(settings, tunnel=tunnel)), server_args.event_loop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
