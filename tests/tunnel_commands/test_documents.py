"""Reading spec text and bounding structures (tunnel_commands.documents)."""

from __future__ import annotations

import json
from typing import Any

from tunnel_commands import ManifestsSpec, parse_command
from tunnel_commands.documents import MAX_DEPTH, MAX_ITEMS, MAX_NODES, MAX_SPEC_BYTES

from .helpers import command, refused

QUERY = {"get": {"apiVersion": "v1", "kind": "Pod", "namespace": "web"}}


def _configmap(data: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": data}


def test_text_over_one_mebibyte_is_refused_before_it_is_parsed() -> None:
    text = "#" * (MAX_SPEC_BYTES + 1)
    assert str(refused(text)) == (
        f"command: is {MAX_SPEC_BYTES + 1} bytes; a spec is at most {MAX_SPEC_BYTES} bytes"
    )


def test_a_mapping_whose_content_is_over_the_limit_is_refused() -> None:
    big = _configmap({f"k{i}": "x" * 1000 for i in range(1200)})
    error = refused(command("manifests", {"objects": [big]}))
    assert str(error) == f"command: is larger than {MAX_SPEC_BYTES} bytes"


def test_a_spec_just_under_the_limit_is_accepted() -> None:
    big = _configmap({f"k{i}": "x" * 1000 for i in range(900)})
    text = json.dumps(command("manifests", {"objects": [big]}))
    assert len(text) < MAX_SPEC_BYTES
    assert isinstance(parse_command(text).spec, ManifestsSpec)


def test_nesting_deeper_than_the_limit_is_refused_naming_the_place() -> None:
    deep: Any = "leaf"
    for _ in range(MAX_DEPTH + 1):
        deep = {"a": deep}
    error = refused(command("manifests", {"objects": [_configmap(deep)]}))
    assert error.path.startswith("spec.objects[0].data.a.a")
    assert error.problem == f"is nested deeper than {MAX_DEPTH} levels"


def test_a_list_longer_than_the_limit_is_refused_naming_it() -> None:
    error = refused(command("query", QUERY, extra=[0] * (MAX_ITEMS + 1)))
    assert str(error) == f"extra: has more than {MAX_ITEMS} items"


def test_a_yaml_alias_bomb_stops_at_the_node_limit() -> None:
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for level in range(1, 10):
        aliases = ", ".join([f"*a{level - 1}"] * 10)
        lines.append(f"a{level}: &a{level} [{aliases}]")
    error = refused("\n".join(lines) + "\n")
    assert str(error) == f"command: has more than {MAX_NODES} values"


def test_yaml_timestamps_stay_strings() -> None:
    text = """
apiVersion: tunnel/v1
type: manifests
name: web-app
spec:
  objects:
    - apiVersion: v1
      kind: ConfigMap
      metadata: {name: cfg}
      data: {since: 2024-01-01, at: 2024-01-01T10:00:00Z}
"""
    spec = parse_command(text).spec
    assert isinstance(spec, ManifestsSpec)
    assert spec.objects[0]["data"] == {"since": "2024-01-01", "at": "2024-01-01T10:00:00Z"}


def test_yaml_errors_give_the_place_but_not_the_text() -> None:
    error = refused("apiVersion: tunnel/v1\npassword: 'hunter2\n")
    assert error.path == "command"
    assert error.problem.startswith("not valid YAML: ")
    assert "line" in error.problem
    assert "hunter2" not in str(error)


def test_json_errors_give_the_place() -> None:
    error = refused('{"apiVersion": "tunnel/v1",}')
    assert error.problem.startswith("not valid JSON: ")
    assert "line 1" in error.problem


def test_json_nan_is_refused() -> None:
    error = refused('{"apiVersion": "tunnel/v1", "x": NaN}')
    assert error.problem.startswith("not valid JSON: ")


def test_yaml_infinity_is_refused_naming_the_field() -> None:
    assert str(refused("apiVersion: tunnel/v1\nx: .inf\n")) == "x: must be a finite number"


def test_several_yaml_documents_are_refused() -> None:
    text = "apiVersion: tunnel/v1\n---\napiVersion: tunnel/v1\n"
    assert str(refused(text)) == "command: must hold one YAML document, not 2"


def test_non_string_keys_are_refused() -> None:
    assert (
        str(refused("apiVersion: tunnel/v1\n1: one\n")) == "command: has a key that is not a string"
    )


def test_text_that_is_not_utf8_is_refused() -> None:
    assert str(refused(b"apiVersion: \xff\xfe\n")) == "command: is not UTF-8 text"


def test_python_objects_in_a_mapping_are_refused() -> None:
    error = refused(command("query", QUERY, extra={"when": object()}))
    assert str(error) == "extra.when: must be a string, number, boolean, list or mapping"
