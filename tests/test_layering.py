"""Each package imports only what its layer allows (STYLE.md, "Layers")."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

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
        {"aiohttp", "yarl", "multidict", "prometheus_client", "yaml", "cryptography"},
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
