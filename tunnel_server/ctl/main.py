"""tunnelctl's commands."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from protocol.errors import TunnelError
from tunnel_cli import env_flag
from tunnel_pki.tls import client_context

from .. import __version__
from .client import ApiClient, CtlError, segment
from .output import print_json, print_table

__all__ = ["main"]

Command = Callable[[ApiClient, argparse.Namespace], int]

CLUSTER_COLUMNS = [
    ("NAME", "name"),
    ("CONNECTED", "connected"),
    ("AGENT", "agent_version"),
    ("REMOTE", "remote_addr"),
    ("CONNECTED SINCE", "connected_since"),
    ("LAST SEEN", "last_seen"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tunnelctl", description="Manage the tunnel server.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    env_flag(parser, "--server", "TUNNELCTL_SERVER", help="server URL, https://HOST:PORT")
    env_flag(parser, "--ca", "TUNNELCTL_CA", help="CA bundle (PEM file) to pin the server with")
    env_flag(parser, "--token", "TUNNELCTL_TOKEN", help="API token")
    env_flag(parser, "--token-file", "TUNNELCTL_TOKEN_FILE", help="file holding the API token")
    commands = parser.add_subparsers(dest="command", required=True)

    cluster = commands.add_parser("cluster", help="register and manage clusters")
    cluster_commands = cluster.add_subparsers(dest="cluster_command", required=True)
    add = cluster_commands.add_parser(
        "add", help="register a cluster and print its agent's install manifest"
    )
    add.add_argument("name")
    add.add_argument("--rbac", default="full", choices=["full", "read-only", "namespaced"])
    _output_flag(add)
    add.set_defaults(run=cluster_add)
    token = cluster_commands.add_parser(
        "token", help="issue a new bootstrap token and print the install manifest again"
    )
    token.add_argument("name")
    _output_flag(token)
    token.set_defaults(run=cluster_token)
    listing = cluster_commands.add_parser("list", help="list clusters and their agents")
    _output_flag(listing)
    listing.set_defaults(run=cluster_list)
    revoke = cluster_commands.add_parser(
        "revoke", help="revoke a cluster's certificates and drop its agent at once"
    )
    revoke.add_argument("name")
    _output_flag(revoke)
    revoke.set_defaults(run=cluster_revoke)
    delete = cluster_commands.add_parser("delete", help="revoke and forget a cluster")
    delete.add_argument("name")
    delete.set_defaults(run=cluster_delete)

    whoami = commands.add_parser("whoami", help="show who the API token belongs to")
    _output_flag(whoami)
    whoami.set_defaults(run=show_whoami)
    return parser


def _output_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", choices=["text", "json"], default="text")


def cluster_add(client: ApiClient, args: argparse.Namespace) -> int:
    answer = client.request("POST", "/api/v1/clusters", {"name": args.name, "rbac": args.rbac})
    return _print_install(answer, args)


def cluster_token(client: ApiClient, args: argparse.Namespace) -> int:
    answer = client.request("POST", f"/api/v1/clusters/{segment(args.name)}/token")
    return _print_install(answer, args)


def _print_install(answer: dict[str, Any], args: argparse.Namespace) -> int:
    if args.output == "json":
        print_json(answer)
    else:
        sys.stdout.write(answer["manifest"])
        print(
            f"# bootstrap token expires at {answer['expires_at']}; "
            f"apply with: kubectl apply -f <this file>",
            file=sys.stderr,
        )
    return 0


def cluster_list(client: ApiClient, args: argparse.Namespace) -> int:
    clusters = client.request("GET", "/api/v1/clusters")
    if args.output == "json":
        print_json(clusters)
    else:
        print_table(clusters, CLUSTER_COLUMNS)
    return 0


def cluster_revoke(client: ApiClient, args: argparse.Namespace) -> int:
    answer = client.request("POST", f"/api/v1/clusters/{segment(args.name)}/revoke")
    if args.output == "json":
        print_json(answer)
    else:
        print(
            f"revoked {answer['revoked_certificates']} certificate(s) of {args.name}; "
            f"agent {'disconnected' if answer['disconnected'] else 'was not connected'}"
        )
    return 0


def cluster_delete(client: ApiClient, args: argparse.Namespace) -> int:
    client.request("DELETE", f"/api/v1/clusters/{segment(args.name)}")
    print(f"deleted cluster {args.name}")
    return 0


def show_whoami(client: ApiClient, args: argparse.Namespace) -> int:
    answer = client.request("GET", "/api/v1/whoami")
    if args.output == "json":
        print_json(answer)
    else:
        print(f"{answer['name']}{' (admin)' if answer['admin'] else ''}")
    return 0


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
    return ApiClient(args.server, token, client_context(ca_pem))


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``tunnelctl``."""
    args = build_parser().parse_args(argv)
    try:
        client = make_client(args)
        run: Command = args.run
        return run(client, args)
    except TunnelError as exc:
        print(f"tunnelctl: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # Output piped to a command that stopped reading (e.g. head).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
