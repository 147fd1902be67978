"""What the dispatcher needs to know of a command: type, name, timeout, attempts, identity.

Validation is tunnel_commands' (shared with the agent, so both sides judge a
spec alike); this module adapts it to the server.
"""

from __future__ import annotations

from typing import Any

from protocol.errors import TunnelError
from tunnel_commands import CommandSpecError, parse_command
from tunnel_server.store.base import Grant, User

__all__ = ["IDENTITY_PREFIX", "SpecError", "command_identity", "spec_facts"]


class SpecError(TunnelError):
    """The spec is not a valid command; the message names the field."""


def spec_facts(document: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, str, float, int]]:
    """The spec's canonical form and ``(type, name, timeout seconds, max attempts)``.

    Raises SpecError, naming the field, for an invalid spec.
    """
    try:
        command = parse_command(document)
    except CommandSpecError as exc:
        raise SpecError(str(exc)) from exc
    facts = (command.type, command.name, float(command.timeout), command.max_attempts)
    return command.to_dict(), facts


#: Every identity the server asserts in a cluster carries this prefix (as kubectl's).
IDENTITY_PREFIX = "tunnel:"


def command_identity(user: User, grant: Grant | None) -> dict[str, Any]:
    """Whom a command of ``user`` acts as in the cluster, as the offer tells the agent.

    As the submitter's kubectl would: ``tunnel:<user>`` in the user's groups,
    then the grant's ``--as-group``s, each under ``tunnel:``; or, with a grant
    made ``--commands-as-agent``, ``{"agent": true}``: the agent's own identity.
    An admin without a grant acts as ``tunnel:<admin>`` in the admin's groups.
    """
    if grant is not None and grant.commands_as_agent:
        return {"agent": True}
    groups = (*user.groups, *(grant.as_groups if grant is not None else ()))
    return {
        "user": IDENTITY_PREFIX + user.name,
        "groups": [IDENTITY_PREFIX + group for group in dict.fromkeys(groups)],
    }
