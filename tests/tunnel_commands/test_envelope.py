"""The command envelope: apiVersion, type, name, timeout, retry, outputsSecret."""

from __future__ import annotations

import json
from typing import Any

import pytest

from protocol.errors import TunnelError
from tunnel_commands import Command, OutputsSecret, QuerySpec, parse_command
from tunnel_commands.spec import DEFAULT_TIMEOUT

from .helpers import command, refused, round_trips

QUERY = {"get": {"apiVersion": "v1", "kind": "Pod", "namespace": "web"}}


def test_a_minimal_command_gets_the_documented_defaults() -> None:
    parsed = parse_command(command("query", QUERY))
    assert isinstance(parsed, Command)
    assert parsed.type == "query"
    assert parsed.name == "web-app"
    assert parsed.timeout == DEFAULT_TIMEOUT == 15 * 60
    assert parsed.max_attempts == 1
    assert parsed.outputs_secret is None
    assert isinstance(parsed.spec, QuerySpec)


def test_every_envelope_field_is_read() -> None:
    parsed = parse_command(
        command(
            "query",
            QUERY,
            timeout="1h30m",
            retry={"maxAttempts": 3},
            outputsSecret={"namespace": "web", "name": "web-app-outputs"},
        )
    )
    assert parsed.timeout == 5400
    assert parsed.max_attempts == 3
    assert parsed.outputs_secret == OutputsSecret("web", "web-app-outputs")
    round_trips(parsed)


def test_yaml_json_and_mapping_forms_read_the_same() -> None:
    document = command("query", QUERY, timeout="10m")
    yaml_text = (
        "apiVersion: tunnel/v1\ntype: query\nname: web-app\ntimeout: 10m\n"
        "spec:\n  get: {apiVersion: v1, kind: Pod, namespace: web}\n"
    )
    assert parse_command(document) == parse_command(json.dumps(document))
    assert parse_command(document) == parse_command(yaml_text)
    assert parse_command(document) == parse_command(yaml_text.encode())


def test_the_error_is_a_tunnel_error_and_a_value_error_with_path_and_problem() -> None:
    error = refused(command("query", QUERY, name="Web_App"))
    assert isinstance(error, TunnelError)
    assert isinstance(error, ValueError)
    assert error.path == "name"
    assert str(error).startswith("name: ")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"apiVersion": "tunnel/v2"}, "apiVersion: 'tunnel/v2' is not supported; use tunnel/v1"),
        ({"apiVersion": None}, "apiVersion: required"),
        ({"type": "shell"}, "type: 'shell' is not a command type"),
        ({"type": 7}, "type: must be a string"),
        ({"name": None}, "name: required"),
        ({"name": ""}, "name: must not be empty"),
        ({"name": "Web-App"}, "name: 'Web-App' is not a name"),
        ({"name": "a" * 54}, "name: "),
        ({"name": "-web"}, "name: '-web' is not a name"),
        ({"timeout": "10 minutes"}, "timeout: must be a duration such as 30s, 10m or 1h30m"),
        ({"timeout": 600}, "timeout: must be a duration"),
        ({"timeout": "25h"}, "timeout: must be between 1s and 24h"),
        ({"timeout": "0s"}, "timeout: must be between 1s and 24h"),
        ({"retry": {"maxAttempts": 11}}, "retry.maxAttempts: must be between 1 and 10"),
        ({"retry": {"maxAttempts": 0}}, "retry.maxAttempts: must be between 1 and 10"),
        ({"retry": {"maxAttempts": "2"}}, "retry.maxAttempts: must be an integer"),
        ({"retry": {"maxAttempts": True}}, "retry.maxAttempts: must be an integer"),
        ({"retry": {"attempts": 2}}, "retry.attempts: unknown field"),
        ({"retry": 2}, "retry: must be a mapping"),
        ({"outputsSecret": {"name": "x"}}, "outputsSecret.namespace: required"),
        ({"outputsSecret": {"namespace": "web", "name": "X"}}, "outputsSecret.name: 'X' is not"),
        ({"spec": None}, "spec: required"),
        ({"spec": []}, "spec: must be a mapping"),
        ({"kind": "Command"}, "kind: unknown field"),
    ],
)
def test_envelope_errors_name_the_field(changes: dict[str, Any], message: str) -> None:
    document = command("query", QUERY)
    for key, value in changes.items():
        if value is None:
            document.pop(key, None)
        else:
            document[key] = value
    assert str(refused(document)).startswith(message)


def test_a_document_that_is_not_a_mapping_is_refused_as_a_whole() -> None:
    assert str(refused("- just\n- a list\n")) == "command: must be a mapping"


def test_a_long_name_is_refused_with_its_limit() -> None:
    assert "at most 53" in str(refused(command("query", QUERY, name="a" * 54)))


def test_a_name_of_53_characters_is_accepted() -> None:
    assert parse_command(command("query", QUERY, name="a" * 53)).name == "a" * 53


def test_errors_never_quote_long_values() -> None:
    error = refused(command("query", QUERY, type="s3cr3t-" * 20))
    assert "s3cr3t-" * 6 not in str(error)
