"""Building command documents for the spec tests."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tunnel_commands import Command, CommandSpecError, parse_command


def command(type_: str, spec: dict[str, Any], **envelope: Any) -> dict[str, Any]:
    """A command document of ``type_`` named ``web-app`` around ``spec``."""
    return {"apiVersion": "tunnel/v1", "type": type_, "name": "web-app", **envelope, "spec": spec}


def refused(document: Any) -> CommandSpecError:
    """The error ``parse_command`` raises for ``document`` (it must raise one)."""
    with pytest.raises(CommandSpecError) as caught:
        parse_command(document)
    return caught.value


def round_trips(parsed: Command) -> None:
    """``to_dict`` reads back to an equal command, from the mapping and as YAML text."""
    assert parse_command(parsed.to_dict()) == parsed
    assert parse_command(yaml.safe_dump(parsed.to_dict())) == parsed
