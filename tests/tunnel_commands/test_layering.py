"""tunnel_commands is shared by agent and server: stdlib, PyYAML and protocol.errors only."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import tunnel_commands

ALLOWED = {"yaml", "protocol.errors", "tunnel_commands"}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_tunnel_commands_imports_only_the_standard_library_pyyaml_and_protocol_errors() -> None:
    package = Path(tunnel_commands.__file__).parent
    outside = {
        f"{path.name}: {name}"
        for path in package.glob("*.py")
        for name in _imports(path)
        if name.split(".")[0] not in sys.stdlib_module_names
        and not any(name == allowed or name.startswith(allowed + ".") for allowed in ALLOWED)
    }
    assert outside == set()
