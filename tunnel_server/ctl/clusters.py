"""tunnelctl cluster ... and whoami."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tunnel_server.ctl.client import ApiClient, segment
from tunnel_server.ctl.common import Subparsers, output_flag
from tunnel_server.ctl.output import print_json, print_table

__all__ = ["register"]

CLUSTER_COLUMNS = [
    ("NAME", "name"),
    ("CONNECTED", "connected"),
    ("REPLICA", "replica"),
    ("AGENT", "agent_version"),
    ("REMOTE", "remote_addr"),
    ("CONNECTED SINCE", "connected_since"),
    ("LAST SEEN", "last_seen"),
]


def register(commands: Subparsers) -> None:
    cluster = commands.add_parser("cluster", help="register and manage clusters")
    cluster_commands = cluster.add_subparsers(dest="cluster_command", required=True)
    add = cluster_commands.add_parser(
        "add", help="register a cluster and print its agent's install manifest"
    )
    add.add_argument("name")
    add.add_argument("--rbac", default="full", choices=["full", "read-only", "namespaced"])
    add.add_argument(
        "--namespaces", default="", help="with --rbac namespaced: comma-separated namespaces"
    )
    output_flag(add)
    add.set_defaults(run=cluster_add)
    token = cluster_commands.add_parser(
        "token", help="issue a new bootstrap token and print the install manifest again"
    )
    token.add_argument("name")
    output_flag(token)
    token.set_defaults(run=cluster_token)
    listing = cluster_commands.add_parser("list", help="list clusters and their agents")
    output_flag(listing)
    listing.set_defaults(run=cluster_list)
    revoke = cluster_commands.add_parser(
        "revoke", help="revoke a cluster's certificates and drop its agent at once"
    )
    revoke.add_argument("name")
    output_flag(revoke)
    revoke.set_defaults(run=cluster_revoke)
    delete = cluster_commands.add_parser("delete", help="revoke and forget a cluster")
    delete.add_argument("name")
    delete.set_defaults(run=cluster_delete)

    status = commands.add_parser("status", help="one screen of fleet health")
    output_flag(status)
    status.set_defaults(run=show_status)

    whoami = commands.add_parser("whoami", help="show who the API token belongs to")
    output_flag(whoami)
    whoami.set_defaults(run=show_whoami)


def cluster_add(client: ApiClient, args: argparse.Namespace) -> int:
    namespaces = [name.strip() for name in args.namespaces.split(",") if name.strip()]
    answer = client.request(
        "POST",
        "/api/v1/clusters",
        {"name": args.name, "rbac": args.rbac, "namespaces": namespaces},
    )
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
            "apply with: kubectl apply -f <this file>",
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


def show_status(client: ApiClient, args: argparse.Namespace) -> int:
    status = client.request("GET", "/api/v1/status")
    if args.output == "json":
        print_json(status)
        return 0
    clusters, commands = status["clusters"], status["commands"]
    print(f"server       {status['server_version']}")
    print(f"clusters     {clusters['connected']}/{clusters['total']} connected")
    if clusters["disconnected"]:
        print(f"  offline    {', '.join(clusters['disconnected'])}")
    outdated = status["agents_out_of_date"]
    print(
        f"agents       {len(outdated)} out of date"
        + (f": {', '.join(outdated)}" if outdated else "")
    )
    print(
        f"commands     {commands['running']} running, {commands['pending']} pending; "
        f"last 24h: {commands['succeeded_24h']} succeeded, {commands['failed_24h']} failed, "
        f"{commands['cancelled_24h']} cancelled"
    )
    replicas = status.get("replicas", [])
    print(f"replicas     {len(replicas)} (this answer from {status.get('replica', '?')})")
    for replica in replicas:
        health = (
            "draining" if replica["draining"] else "healthy" if replica["healthy"] else "silent"
        )
        print(
            f"  {replica['name']:<16} {health:<9} {replica['agents']:>6} agents  "
            f"{replica['address']}  {replica['version']}"
        )
    return 0
