"""Each package imports only what its layer allows (STYLE.md, "Layers").

The contracts docs/architecture.md states live in pyproject.toml
(``[tool.importlinter]``) and are checked here by import-linter; the
third-party allowances per package, and the absence of import cycles, are
checked by this module itself.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parent.parent
OURS = {
    "protocol",
    "tunnel_agent",
    "tunnel_cli",
    "tunnel_commands",
    "tunnel_kube",
    "tunnel_mux",
    "tunnel_pki",
    "tunnel_server",
}
STDLIB = set(sys.stdlib_module_names)

#: For each package: which of our packages and which third-party ones it may import.
ALLOWED: dict[str, tuple[set[str], set[str]]] = {
    "protocol": (set(), {"msgpack"}),
    "tunnel_kube": (set(), set()),
    "tunnel_cli": ({"protocol"}, set()),
    "tunnel_commands": ({"protocol"}, {"yaml"}),
    "tunnel_pki": ({"protocol"}, {"cryptography"}),
    "tunnel_mux": ({"protocol"}, {"aiohttp", "prometheus_client"}),
    "tunnel_agent": (
        {"protocol", "tunnel_cli", "tunnel_commands", "tunnel_kube", "tunnel_mux", "tunnel_pki"},
        {
            "aiohttp",
            "yarl",
            "kubernetes_asyncio",
            "prometheus_client",
            "yaml",
            "cryptography",
            "httptools",
        },
    ),
    "tunnel_server": (
        {"protocol", "tunnel_cli", "tunnel_commands", "tunnel_kube", "tunnel_mux", "tunnel_pki"},
        {
            "aiohttp",
            "yarl",
            "multidict",
            "prometheus_client",
            "yaml",
            "cryptography",
            "asyncpg",
            "jinja2",  # the web console's templates (tunnel_server/console)
        },
    ),
}
#: Standard-library modules that would make the protocol package do I/O.
IO_MODULES = {"asyncio", "socket", "ssl", "selectors", "threading", "logging.config"}


def imports(package: str) -> list[tuple[Path, str]]:
    found: list[tuple[Path, str]] = []
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found.extend((path, alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.append((path, node.module))
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_what_its_layer_allows(package: str) -> None:
    ours, third_party = ALLOWED[package]
    wrong = []
    for path, module in imports(package):
        top = module.split(".")[0]
        if top == package or (top in STDLIB and not (package == "protocol" and top in IO_MODULES)):
            continue
        if (top in OURS and top in ours) or top in third_party:
            continue
        wrong.append(f"{path.relative_to(ROOT)} imports {module}")
    assert wrong == []


def test_agent_and_server_never_import_each_other() -> None:
    assert not [m for _, m in imports("tunnel_agent") if m.split(".")[0] == "tunnel_server"]
    assert not [m for _, m in imports("tunnel_server") if m.split(".")[0] == "tunnel_agent"]


def test_protocol_is_sans_io() -> None:
    offending = [
        f"{path.name}: {module}"
        for path, module in imports("protocol")
        if module.split(".")[0] in IO_MODULES or module.split(".")[0] in ("aiohttp", "websockets")
    ]
    assert offending == []


def test_import_linter_contracts_hold() -> None:
    """pyproject.toml's contracts: sans-I/O protocol, agent and server apart, the
    shared packages below both, and the server's edge and relay in their rooms."""
    result = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


#: Imports under TYPE_CHECKING that name the object which owns and drives the
#: importing one (a stream's session, the connection whose frames a handler
#: applies): annotations of a parent handed to its child, compiled by mypyc
#: into direct attribute access. The only back references allowed.
TYPE_ONLY_PARENTS = {
    ("protocol.handlers", "protocol.connection"),
    ("tunnel_mux.stream", "tunnel_mux.session"),
}


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_modules_import_each_other_one_way(package: str) -> None:
    """No circle of imports inside a package, those under TYPE_CHECKING included."""
    graph = grimp.build_graph(package)
    for importer, imported in TYPE_ONLY_PARENTS:
        if importer.startswith(package + "."):
            graph.remove_import(importer=importer, imported=imported)
    circles = []
    for module in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back is not None:
                circles.append(" -> ".join((module, *back)))
    assert circles == []
