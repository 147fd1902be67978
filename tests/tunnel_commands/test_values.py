"""secretRef shapes and durations (tunnel_commands.values, tunnel_commands.durations)."""

from __future__ import annotations

from typing import Any

import pytest

from tunnel_commands import CommandSpecError, OutputRef, SecretRef
from tunnel_commands.durations import format_duration, parse_duration
from tunnel_commands.values import Scope, dump_value, parse_value, references

from .helpers import command, refused

GIT = {"url": "https://git.example.com/infra.git", "ref": "main"}


def _variable(value: Any) -> CommandSpecError:
    return refused(command("tofu", {"git": GIT, "variables": {"x": value}}))


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ({"name": "db", "key": "pw"}, "spec.variables.x.secretRef.namespace: required"),
        ({"namespace": "vault", "key": "pw"}, "spec.variables.x.secretRef.name: required"),
        ({"namespace": "vault", "name": "db"}, "spec.variables.x.secretRef.key: required"),
        (
            {"namespace": "vault", "name": "db", "key": 5},
            "spec.variables.x.secretRef.key: must be a string",
        ),
        (
            {"namespace": "vault", "name": "db", "key": "a b"},
            "spec.variables.x.secretRef.key: 'a b' is not a Secret key",
        ),
        (
            {"namespace": "vault\n", "name": "db", "key": "pw"},
            "spec.variables.x.secretRef.namespace: 'vault\\n' is not a namespace name",
        ),
        (
            {"namespace": "vault", "name": "db", "key": "pw\n"},
            "spec.variables.x.secretRef.key: 'pw\\n' is not a Secret key",
        ),
        (
            {"namespace": "Vault", "name": "db", "key": "pw"},
            "spec.variables.x.secretRef.namespace: 'Vault' is not a namespace name",
        ),
        (
            {"namespace": "vault", "name": "db", "key": "pw", "optional": True},
            "spec.variables.x.secretRef.optional: unknown field",
        ),
        ("db", "spec.variables.x.secretRef: must be a mapping of namespace, name and key"),
        (["db"], "spec.variables.x.secretRef: must be a mapping of namespace, name and key"),
    ],
)
def test_secret_ref_shape_errors_name_the_field(ref: Any, message: str) -> None:
    assert str(_variable({"secretRef": ref})) == message


def test_references_are_found_and_dumped_back() -> None:
    raw = {
        "a": [{"secretRef": {"namespace": "n", "name": "s", "key": "k"}}],
        "b": {"outputRef": {"step": "infra", "output": "host"}},
        "c": {"secretRef": {"name": "kept"}},
    }
    value = parse_value(raw, "x", Scope("cmd", {"infra": "tofu"}))
    assert list(references(value)) == [SecretRef("n", "s", "k"), OutputRef("infra", "host")]
    assert dump_value(value) == raw


def test_a_secret_ref_beside_other_keys_is_an_ordinary_field() -> None:
    raw = {"secretRef": {"namespace": "n", "name": "s", "key": "k"}, "other": 1}
    value = parse_value(raw, "x", Scope("cmd"))
    assert list(references(value)) == []


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("10m", 600), ("1h", 3600), ("1h30m", 5400), ("1h0m5s", 3605), ("90s", 90)],
)
def test_durations_are_parsed(text: str, seconds: int) -> None:
    assert parse_duration(text, "t", minimum=1, maximum=86400) == seconds


@pytest.mark.parametrize(
    "text", ["", "10", "1d", "5 m", "-1s", "1.5h", "1m1h", "1234567s", "10m\n"]
)
def test_malformed_durations_are_refused(text: str) -> None:
    with pytest.raises(CommandSpecError, match="must be a duration"):
        parse_duration(text, "t", minimum=1, maximum=86400)


@pytest.mark.parametrize(
    ("seconds", "text"), [(30, "30s"), (600, "10m"), (5400, "1h30m"), (3605, "1h5s")]
)
def test_durations_are_written_in_the_shortest_form(seconds: int, text: str) -> None:
    assert format_duration(seconds) == text
