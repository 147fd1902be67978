"""The executors may use tunnel_commands, tunnel_pki and the agent, never the server."""

from __future__ import annotations

import ast
from pathlib import Path

import tunnel_agent.executors

FORBIDDEN = ("tunnel_server", "tests")


def test_the_executors_never_import_the_server() -> None:
    package = Path(tunnel_agent.executors.__file__).parent
    found: set[str] = set()
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            modules: list[str] = []
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules = [node.module]
            found.update(f"{path.name}: {m}" for m in modules if m.split(".")[0] in FORBIDDEN)
    assert found == set()
