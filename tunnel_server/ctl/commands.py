"""tunnelctl run and tunnelctl commands list|show|cancel|logs."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import yaml

from tunnel_cli import printable, printable_line
from tunnel_server.ctl.client import ApiClient, CtlError, segment
from tunnel_server.ctl.common import Subparsers, output_flag
from tunnel_server.ctl.output import print_json, print_table

__all__ = ["register"]

_FINAL_OK = "succeeded"


def register(commands: Subparsers) -> None:
    run = commands.add_parser("run", help="dispatch a command to a cluster")
    run.add_argument("--cluster", required=True)
    run.add_argument(
        "-f", "--file", required=True, help="the command spec (YAML or JSON; - for stdin)"
    )
    run.add_argument(
        "--follow", action="store_true", help="stream progress; exit non-zero on failure"
    )
    run.add_argument("--timeout", help="the command's timeout (e.g. 10m), overriding the spec's")
    run.add_argument("--idempotency-key", help="return the existing command on a repeat")
    output_flag(run)
    run.set_defaults(run=run_command)

    group = commands.add_parser("commands", help="list, show, cancel commands and read their logs")
    sub = group.add_subparsers(dest="commands_command", required=True)
    listing = sub.add_parser("list", help="list commands, newest first")
    listing.add_argument("--cluster")
    listing.add_argument("--state")
    listing.add_argument("--limit", type=int, default=50)
    output_flag(listing)
    listing.set_defaults(run=list_commands)
    show = sub.add_parser("show", help="show one command")
    show.add_argument("id")
    output_flag(show)
    show.set_defaults(run=show_command)
    cancel = sub.add_parser("cancel", help="cancel a command (stops it if running)")
    cancel.add_argument("id")
    output_flag(cancel)
    cancel.set_defaults(run=cancel_command)
    logs = sub.add_parser("logs", help="print a command's log")
    logs.add_argument("id")
    logs.add_argument("--follow", "-f", action="store_true", help="until the command finishes")
    logs.set_defaults(run=command_logs)


def run_command(client: ApiClient, args: argparse.Namespace) -> int:
    document = _load_spec(args.file)
    if args.timeout:
        document["timeout"] = args.timeout
    body: dict[str, Any] = {"spec": document}
    if args.idempotency_key:
        body["idempotency_key"] = args.idempotency_key
    command = client.request("POST", f"/api/v1/clusters/{segment(args.cluster)}/commands", body)
    if not args.follow:
        if args.output == "json":
            print_json(command)
        else:
            print(command["id"])
        return 0
    print(f"# command {command['id']} ({command['state']})", file=sys.stderr)
    return _follow(client, command["id"], args.output)


def list_commands(client: ApiClient, args: argparse.Namespace) -> int:
    query = {
        key: value
        for key, value in (
            ("cluster", args.cluster),
            ("state", args.state),
            ("limit", str(args.limit)),
        )
        if value
    }
    commands = client.request("GET", f"/api/v1/commands?{urlencode(query)}")
    if args.output == "json":
        print_json(commands)
    else:
        print_table(
            commands,
            [
                ("ID", "id"),
                ("CLUSTER", "cluster"),
                ("TYPE", "type"),
                ("NAME", "name"),
                ("STATE", "state"),
                ("ATTEMPT", "attempt"),
                ("SUBMITTER", "submitter"),
                ("CREATED", "created_at"),
            ],
        )
    return 0


def show_command(client: ApiClient, args: argparse.Namespace) -> int:
    command = client.request("GET", f"/api/v1/commands/{segment(args.id)}")
    if args.output == "json":
        print_json(command)
    else:
        for key in (
            "id",
            "cluster",
            "type",
            "name",
            "state",
            "attempt",
            "submitter",
            "created_at",
            "started_at",
            "finished_at",
            "error",
        ):
            value = command.get(key)
            print(f"{key + ':':<13} {'-' if value is None else printable(str(value))}")
        result = command.get("result") or {}
        if result.get("outputs"):
            print(f"{'outputs:':<13} {_names(result['outputs'])} (values stay in the cluster)")
        if result.get("summary"):
            print("summary:")
            print(json.dumps(result["summary"], indent=2))
    return 0


def cancel_command(client: ApiClient, args: argparse.Namespace) -> int:
    command = client.request("POST", f"/api/v1/commands/{segment(args.id)}/cancel")
    if args.output == "json":
        print_json(command)
    else:
        print(
            f"command {command['id']} is {command['state']}"
            + (
                " (cancel requested)"
                if command["cancel_requested"] and not command["finished_at"]
                else ""
            )
        )
    return 0


def command_logs(client: ApiClient, args: argparse.Namespace) -> int:
    follow = "&follow=1" if args.follow else ""
    final = _print_log(client, f"/api/v1/commands/{segment(args.id)}/logs?after=0{follow}")
    return 0 if final is None or not args.follow or final["state"] == _FINAL_OK else 1


def _follow(client: ApiClient, command_id: str, output: str) -> int:
    try:
        final = _print_log(client, f"/api/v1/commands/{segment(command_id)}/logs?follow=1")
    except CtlError as exc:
        # The command was submitted, and may go on without us: say how to catch up.
        raise CtlError(
            f"{exc} (to follow it again: tunnelctl commands logs {command_id} --follow)"
        ) from exc
    if final is None:
        raise CtlError("the server ended the log stream without the command's outcome")
    if output == "json":
        print_json(final)
    else:
        outcome = final["state"]
        detail = f": {printable(str(final['error']))}" if final.get("error") else ""
        result = final.get("result") or {}
        if result.get("summary"):
            print(json.dumps(result["summary"], indent=2))
        if result.get("outputs"):
            print(f"outputs (kept in the cluster): {_names(result['outputs'])}")
        print(f"# command {command_id} {outcome}{detail}", file=sys.stderr)
    return 0 if final["state"] == _FINAL_OK else 1


def _print_log(client: ApiClient, path: str) -> dict[str, Any] | None:
    """Print a command's log lines as they come; the command's final record, if sent."""
    final = None
    for record in client.records(path):
        if "text" in record:
            print(printable_line(str(record["text"])), flush=True)
        elif "command" in record:
            final = record["command"]
        elif "error" in record:  # the server could not go on (keepalives are skipped)
            raise CtlError(str(record["error"]))
    return final


def _names(names: list[Any]) -> str:
    """Output names as the agent gave them, safe to print."""
    return printable(", ".join(str(name) for name in names))


def _load_spec(path: str) -> dict[str, Any]:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        raise CtlError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CtlError(f"{path} is not valid YAML or JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise CtlError(f"{path} must hold one command (a mapping with apiVersion, type, spec)")
    return document
