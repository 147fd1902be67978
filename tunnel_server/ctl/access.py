"""tunnelctl user ..., grant, ungrant, grants, kubeconfig, audit, requests."""

from __future__ import annotations

import argparse
import sys
from typing import Any
from urllib.parse import urlencode

from tunnel_server.ctl.client import ApiClient, CtlError, segment
from tunnel_server.ctl.common import Subparsers, output_flag
from tunnel_server.ctl.output import print_json, print_table

__all__ = ["register"]

#: What a bare --impersonate stands for: anyone under tunnel:.
_ANYONE = "*"
_TTL_HELP = (
    "the token expires after this long (e.g. 8h, 30d); "
    "default: the server's --max-api-token-ttl, else never"
)


def register(commands: Subparsers) -> None:
    user = commands.add_parser("user", help="manage users and their API tokens")
    user_commands = user.add_subparsers(dest="user_command", required=True)
    add = user_commands.add_parser("add", help="create a user and print its API token")
    add.add_argument("name")
    add.add_argument("--group", action="append", default=[], help="a group (repeatable)")
    add.add_argument("--admin", action="store_true", help="the user administers the server")
    add.add_argument("--token-ttl", metavar="DURATION", help=_TTL_HELP)
    output_flag(add)
    add.set_defaults(run=user_add)
    listing = user_commands.add_parser("list", help="list users")
    output_flag(listing)
    listing.set_defaults(run=user_list)
    delete = user_commands.add_parser("delete", help="delete a user, its tokens and grants")
    delete.add_argument("name")
    delete.set_defaults(run=user_delete)
    token = user_commands.add_parser("token", help="issue another API token for a user")
    token.add_argument("name")
    token.add_argument(
        "--revoke-others", action="store_true", help="revoke the user's other tokens (rotation)"
    )
    token.add_argument("--ttl", metavar="DURATION", help=_TTL_HELP)
    output_flag(token)
    token.set_defaults(run=user_token)
    revoke = user_commands.add_parser("revoke-tokens", help="revoke every API token of a user")
    revoke.add_argument("name")
    revoke.set_defaults(run=user_revoke_tokens)

    grant = commands.add_parser("grant", help="let a user reach a cluster")
    grant.add_argument("user")
    grant.add_argument("--cluster", required=True)
    grant.add_argument(
        "--as-group", action="append", default=[], help="Kubernetes group in the cluster"
    )
    grant.add_argument(
        "--commands", action="store_true", help="may dispatch commands (they act as the user)"
    )
    grant.add_argument(
        "--commands-as-agent",
        action="store_true",
        help="with --commands: the user's commands act with the agent's identity, not as "
        "tunnel:USER (the old behaviour; recorded in the audit trail)",
    )
    grant.add_argument(
        "--impersonate",
        action="append",
        nargs="?",
        const=_ANYONE,
        metavar="USER|group:GROUP",
        help="may use kubectl --as/--as-group: alone, as anyone under tunnel:; with a user "
        "name or group:GROUP (repeatable), as those only (a grant naming groups only lets "
        "the user add those groups to its own name)",
    )
    output_flag(grant)
    grant.set_defaults(run=grant_access)
    ungrant = commands.add_parser("ungrant", help="take a user's access to a cluster away")
    ungrant.add_argument("user")
    ungrant.add_argument("--cluster", required=True)
    ungrant.set_defaults(run=ungrant_access)
    grants = commands.add_parser("grants", help="list grants")
    grants.add_argument("--user")
    grants.add_argument("--cluster")
    output_flag(grants)
    grants.set_defaults(run=list_grants)

    kubeconfig = commands.add_parser(
        "kubeconfig", help="print a kubeconfig for a cluster (with a new token of the user)"
    )
    kubeconfig.add_argument("--cluster", required=True)
    kubeconfig.add_argument("--user", required=True)
    kubeconfig.add_argument("--ttl", metavar="DURATION", help=_TTL_HELP)
    kubeconfig.set_defaults(run=make_kubeconfig)

    audit = commands.add_parser("audit", help="show the audit trail, newest first")
    audit.add_argument("--cluster")
    audit.add_argument("--user")
    audit.add_argument("--kind", choices=["proxy", "command", "admin"])
    audit.add_argument("--limit", type=int, default=50)
    output_flag(audit)
    audit.set_defaults(run=show_audit)

    requests = commands.add_parser(
        "requests", help="show the kubectl requests in progress (watch, exec ...), oldest first"
    )
    requests.add_argument("--cluster")
    requests.add_argument("--user")
    requests.add_argument("--limit", type=int, default=100)
    output_flag(requests)
    requests.set_defaults(run=show_requests)


def user_add(client: ApiClient, args: argparse.Namespace) -> int:
    body = {"name": args.name, "groups": args.group, "admin": args.admin}
    if args.token_ttl is not None:
        body["token_ttl"] = args.token_ttl
    answer = client.request("POST", "/api/v1/users", body)
    if args.output == "json":
        print_json(answer)
    else:
        print(answer["token"])
        print(f"# API token of {args.name}; it is shown only now{_expiry(answer)}", file=sys.stderr)
    return 0


def user_list(client: ApiClient, args: argparse.Namespace) -> int:
    users = client.request("GET", "/api/v1/users")
    if args.output == "json":
        print_json(users)
    else:
        print_table(
            users,
            [("NAME", "name"), ("GROUPS", "groups"), ("ADMIN", "admin"), ("IDENTITY", "identity")],
        )
    return 0


def user_delete(client: ApiClient, args: argparse.Namespace) -> int:
    answer = client.request("DELETE", f"/api/v1/users/{segment(args.name)}")
    print(f"deleted user {args.name}{_ended(answer)}")
    return 0


def user_token(client: ApiClient, args: argparse.Namespace) -> int:
    query = {"revoke_others": "1"} if args.revoke_others else {}
    if args.ttl is not None:
        query["ttl"] = args.ttl
    answer = client.request("POST", f"/api/v1/users/{segment(args.name)}/tokens?{urlencode(query)}")
    if args.output == "json":
        print_json(answer)
    else:
        print(answer["token"])
        if expiry := _expiry(answer):
            print(f"# API token of {args.name}{expiry}", file=sys.stderr)
        if ended := _ended(answer):
            print(f"# revoked the other tokens of {args.name}{ended}", file=sys.stderr)
    return 0


def user_revoke_tokens(client: ApiClient, args: argparse.Namespace) -> int:
    answer = client.request("DELETE", f"/api/v1/users/{segment(args.name)}/tokens")
    print(f"revoked {answer['revoked']} API token(s) of {args.name}{_ended(answer)}")
    return 0


def grant_access(client: ApiClient, args: argparse.Namespace) -> int:
    asked = args.impersonate or []
    targets = [target for target in asked if target != _ANYONE]
    if targets and _ANYONE in asked:
        raise CtlError(
            "give --impersonate alone (anyone under tunnel:) or with names (only those), not both"
        )
    answer = client.request(
        "PUT",
        f"/api/v1/grants/{segment(args.user)}/{segment(args.cluster)}",
        {
            "as_groups": args.as_group,
            "commands": args.commands or args.commands_as_agent,
            "commands_as_agent": args.commands_as_agent,
            "impersonate": bool(asked),
            "impersonate_targets": targets,
        },
    )
    if args.output == "json":
        print_json(answer)
    else:
        print(f"granted {args.user} access to {args.cluster}{_ended(answer)}")
    return 0


def ungrant_access(client: ApiClient, args: argparse.Namespace) -> int:
    answer = client.request(
        "DELETE", f"/api/v1/grants/{segment(args.user)}/{segment(args.cluster)}"
    )
    print(f"{args.user} no longer reaches {args.cluster}{_ended(answer)}")
    return 0


def _expiry(answer: Any) -> str:
    """When the answer's new token expires, as the end of a sentence ("" if never)."""
    expires_at = answer.get("expires_at") if isinstance(answer, dict) else None
    return f"; it expires at {expires_at}" if expires_at else ""


def _ended(answer: Any) -> str:
    """What the server says it ended: the kubectl requests (watch, exec...) in progress."""
    ended = answer.get("ended_requests", 0) if isinstance(answer, dict) else 0
    return f"; ended {ended} kubectl request(s) in progress" if ended else ""


def list_grants(client: ApiClient, args: argparse.Namespace) -> int:
    query = {key: value for key, value in (("user", args.user), ("cluster", args.cluster)) if value}
    grants = client.request("GET", "/api/v1/grants" + (f"?{urlencode(query)}" if query else ""))
    if args.output == "json":
        print_json(grants)
    else:
        print_table(
            [
                {**grant, "impersonate": _whom(grant), "commands": _commands(grant)}
                for grant in grants
            ],
            [
                ("USER", "user"),
                ("CLUSTER", "cluster"),
                ("AS GROUPS", "as_groups"),
                ("COMMANDS", "commands"),
                ("IMPERSONATE", "impersonate"),
            ],
        )
    return 0


def _commands(grant: dict[str, Any]) -> str:
    """Whether, and as whom, a grant's user may send commands, as the grants table says it."""
    if not grant.get("commands"):
        return "no"
    return "as-agent" if grant.get("commands_as_agent") else "as-user"


def _whom(grant: dict[str, Any]) -> str:
    """Whom a grant lets its user impersonate, as the grants table says it."""
    if not grant.get("impersonate"):
        return "no"
    return ",".join(grant.get("impersonate_targets") or []) or "anyone"


def make_kubeconfig(client: ApiClient, args: argparse.Namespace) -> int:
    query = {"cluster": args.cluster}
    if args.ttl is not None:
        query["ttl"] = args.ttl
    answer = client.request(
        "POST", f"/api/v1/users/{segment(args.user)}/kubeconfig?{urlencode(query)}"
    )
    sys.stdout.write(answer["kubeconfig"])
    if expiry := _expiry(answer):
        print(f"# the kubeconfig's token{expiry}", file=sys.stderr)
    if not answer["granted"]:
        print(
            f"# warning: {args.user} has no grant on {args.cluster}; "
            f"run tunnelctl grant {args.user} --cluster {args.cluster}",
            file=sys.stderr,
        )
    return 0


def show_audit(client: ApiClient, args: argparse.Namespace) -> int:
    events = client.request("GET", "/api/v1/audit?" + _filters(args, "cluster", "user", "kind"))
    if args.output == "json":
        print_json(events)
    else:
        print_table(
            [_with_identity(event) for event in events],
            [
                ("TIME", "time"),
                ("USER", "user"),
                ("AS", "as"),
                ("CLUSTER", "cluster"),
                ("KIND", "kind"),
                ("VERB", "verb"),
                ("PATH", "path"),
                ("STATUS", "status"),
                ("IN", "bytes_in"),
                ("OUT", "bytes_out"),
                ("MS", "duration_ms"),
                ("DETAIL", "detail"),
            ],
        )
    return 0


def _with_identity(event: dict[str, Any]) -> dict[str, Any]:
    """An audit event with who the cluster was told the caller is in a column of its own.

    ``tunnel:alice [tunnel:platform]``, and ``(--as)`` after it when the caller
    chose that identity with its own Impersonate-* headers; ``-`` where none was sent.
    """
    detail = event.get("detail")
    if not isinstance(detail, dict) or not isinstance(detail.get("as"), dict):
        return event
    identity = detail["as"]
    groups = " ".join(str(group) for group in identity.get("groups") or [])
    shown = str(identity.get("user", "")) + (f" [{groups}]" if groups else "")
    if identity.get("impersonated"):
        shown += " (--as)"
    rest = {key: value for key, value in detail.items() if key != "as"}
    return {**event, "as": shown, "detail": rest or None}


def show_requests(client: ApiClient, args: argparse.Namespace) -> int:
    requests = client.request("GET", "/api/v1/requests?" + _filters(args, "cluster", "user"))
    if args.output == "json":
        print_json(requests)
    else:
        print_table(
            requests,
            [
                ("STARTED", "started"),
                ("USER", "user"),
                ("CLUSTER", "cluster"),
                ("VERB", "verb"),
                ("PATH", "path"),
                ("SECONDS", "seconds"),
                ("IN", "bytes_in"),
                ("OUT", "bytes_out"),
            ],
        )
    return 0


def _filters(args: argparse.Namespace, *names: str) -> str:
    """The query string of a listing: the filters given, and ``--limit``."""
    given = {name: getattr(args, name) for name in names if getattr(args, name)}
    return urlencode({**given, "limit": str(args.limit)})
