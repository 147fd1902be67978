"""Whom a command acts as in the cluster: its submitter, or (by an admin's grant) the agent.

The server decides it and sends it with each offer (``identity`` in the
offer's record, beside the spec): ``{"user": "tunnel:alice", "groups":
["tunnel:platform"]}``, the identity the submitter's kubectl has, or
``{"agent": true}`` for a grant made ``--commands-as-agent``. The agent takes
it from the offer only, never from a spec, and holds it to the rule it holds
kubectl's identities to (:mod:`tunnel_agent.policy`): names under
``tunnel:``, never ``tunnel:system*``. Every API call of the command then
carries ``Impersonate-User`` and one ``Impersonate-Group`` per group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["AGENT", "IDENTITY_PREFIX", "MAX_GROUPS", "RunIdentity", "identity_from_offer"]

IDENTITY_PREFIX = "tunnel:"
#: Groups one identity may carry (the API server's own bound on impersonated groups is near).
MAX_GROUPS = 64
_MAX_NAME = 128


@dataclass(frozen=True, slots=True)
class RunIdentity:
    """``user`` in ``groups``, by impersonation; ``user`` None: the agent's own identity."""

    user: str | None = None
    groups: tuple[str, ...] = ()

    @property
    def as_agent(self) -> bool:
        return self.user is None

    def headers(self) -> list[tuple[str, str]]:
        """The ``Impersonate-*`` headers that make a request act as this identity."""
        if self.user is None:
            return []
        return [("Impersonate-User", self.user)] + [
            ("Impersonate-Group", group) for group in self.groups
        ]

    def describe(self) -> str:
        """For messages: ``tunnel:alice (groups tunnel:ops)``, or ``the agent``."""
        if self.user is None:
            return "the agent"
        if not self.groups:
            return self.user
        return f"{self.user} (groups {', '.join(self.groups)})"

    def to_dict(self) -> dict[str, Any]:
        if self.user is None:
            return {"agent": True}
        return {"user": self.user, "groups": list(self.groups)}


#: The agent's own identity (a grant made --commands-as-agent).
AGENT = RunIdentity()


def identity_from_offer(value: Any) -> RunIdentity:
    """The identity an offer names; ValueError, saying why, for anything else."""
    if not isinstance(value, dict):
        raise ValueError("the offer names no identity to act as (is the server older?)")
    if value.get("agent") is True and set(value) == {"agent"}:
        return AGENT
    user, groups = value.get("user"), value.get("groups", [])
    if set(value) - {"user", "groups"} or not isinstance(groups, list):
        raise ValueError("the offer's identity is malformed")
    if len(groups) > MAX_GROUPS:
        raise ValueError(f"the offer's identity has more than {MAX_GROUPS} groups")
    for name in (user, *groups):
        _check(name)
    assert isinstance(user, str)
    return RunIdentity(user, tuple(dict.fromkeys(str(group) for group in groups)))


def _check(name: Any) -> None:
    if not isinstance(name, str) or not name or len(name) > _MAX_NAME:
        raise ValueError("the offer's identity is malformed")
    if not name.startswith(IDENTITY_PREFIX) or name.startswith(IDENTITY_PREFIX + "system"):
        raise ValueError(f"identity {name[:64]!r} is outside {IDENTITY_PREFIX}")
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in name):
        raise ValueError("the offer's identity is malformed")
