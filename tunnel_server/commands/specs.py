"""What the dispatcher needs to know of a spec: type, name, timeout, attempts.

Validation is tunnel_commands' (shared with the agent, so both sides judge a
spec alike); this module adapts it to the server.
"""

from __future__ import annotations

from typing import Any

from protocol.errors import TunnelError
from tunnel_commands import CommandSpecError, parse_command

__all__ = ["SpecError", "spec_facts"]


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
