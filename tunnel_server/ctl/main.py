"""tunnelctl's parser and entry point; the commands live in their modules."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from protocol.errors import TunnelError
from tunnel_cli import OnCommandLine, env_flag, printable
from tunnel_pki.errors import PkiError
from tunnel_pki.tls import client_context
from tunnel_server import __version__
from tunnel_server.ctl import access, clusters
from tunnel_server.ctl import commands as commands_module
from tunnel_server.ctl.client import ApiClient, CtlError
from tunnel_server.ctl.common import Command

__all__ = ["build_parser", "main"]

#: Said on stderr when the API token comes as a flag (never the token itself).
_PS_SHOWS_THE_FLAG = (
    "tunnelctl: warning: --token puts the API token on the command line, where anyone on this "
    "machine can read it (ps, /proc); use --token-file or TUNNELCTL_TOKEN instead"
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tunnelctl", description="Manage the tunnel server.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    env_flag(parser, "--server", "TUNNELCTL_SERVER", help="server URL, https://HOST:PORT")
    env_flag(parser, "--ca", "TUNNELCTL_CA", help="CA bundle (PEM file) to pin the server with")
    env_flag(
        parser,
        "--token",
        "TUNNELCTL_TOKEN",
        action=OnCommandLine,
        help="API token (on the command line, ps shows it: prefer --token-file or the variable)",
    )
    parser.set_defaults(token_on_command_line=False)
    env_flag(parser, "--token-file", "TUNNELCTL_TOKEN_FILE", help="file holding the API token")
    commands = parser.add_subparsers(dest="command", required=True)
    clusters.register(commands)
    access.register(commands)
    commands_module.register(commands)
    return parser


def make_client(args: argparse.Namespace) -> ApiClient:
    if not args.server:
        raise CtlError("no server: give --server or set TUNNELCTL_SERVER")
    if not args.ca:
        raise CtlError("no CA bundle: give --ca or set TUNNELCTL_CA (the server's ca.crt)")
    token = args.token
    if not token and args.token_file:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as exc:
            raise CtlError(f"cannot read the token file {args.token_file}: {exc.strerror}") from exc
    if not token:
        raise CtlError("no API token: give --token, --token-file, or set TUNNELCTL_TOKEN")
    try:
        ca_pem = Path(args.ca).read_bytes()
    except OSError as exc:
        raise CtlError(f"cannot read the CA bundle {args.ca}: {exc.strerror}") from exc
    try:
        context = client_context(ca_pem)
    except PkiError as exc:
        raise CtlError(f"the CA bundle {args.ca} cannot be used: {exc}") from exc
    return ApiClient(args.server, token, context)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``tunnelctl``."""
    args = build_parser().parse_args(argv)
    if args.token_on_command_line and args.token:
        print(_PS_SHOWS_THE_FLAG, file=sys.stderr)
    try:
        client = make_client(args)
        run: Command = args.run
        return run(client, args)
    except TunnelError as exc:
        # The message may quote what the server or an agent said: one line, no escapes.
        print(f"tunnelctl: {printable(str(exc))}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # Output piped to a command that stopped reading (e.g. head).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
