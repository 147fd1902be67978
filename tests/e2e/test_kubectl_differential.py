"""The real kubectl prints the same through the tunnel as directly, command for command.

Each command runs twice against the same stand-in cluster: once directly, as
the identity the tunnel asserts (the stand-in's admin token impersonating
``tunnel:alice`` in ``tunnel:platform``), and once through the server and the
agent. What may differ is masked first: the server URL, UIDs, times, ages,
resourceVersions and continue tokens; and a command that writes works on a
name of its own per side. Anything else that differs is the tunnel's doing.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.e2e import test_kubectl_tunnel as kubectl_e2e
from tests.e2e.test_kubectl_tunnel import Tunnel
from tests.kubestub_tests.kubectl import Kubectl, Result

server = kubectl_e2e.server
tunnel = kubectl_e2e.tunnel

_MASKS = [
    (re.compile(r"https://127\.0\.0\.1:\d+(/k8s/clusters/prod-eu)?"), "SERVER"),
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "UID"),
    (re.compile(r'(resourceVersion"?\s*[:=]\s*"?)\d+'), r"\1RV"),
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z"), "TIME"),
    (re.compile(r"(?<![\w.-])\d+(?:s|m\d*s?|h\d*m?|d\d*h?)(?![\w.-])"), "AGE"),
    (re.compile(r'"continue":\s*"[^"]*"'), '"continue": "TOKEN"'),
    (re.compile(r"(direct|tunnel)-side"), "SIDE-side"),
]

#: {side} becomes "direct-side" or "tunnel-side": what one run writes, the other does not see.
COMMANDS = [
    ("get", "pods"),
    ("get", "pods", "-A", "-o", "wide"),
    ("get", "pod", "demo", "-o", "yaml"),
    ("get", "pod", "demo", "-o", "json"),
    ("get", "pods", "-o", "name"),
    ("get", "pods", "-o", "jsonpath={.items[*].metadata.name}"),
    ("get", "pods", "-o", "custom-columns=NAME:.metadata.name,NODE:.spec.nodeName"),
    ("get", "pods", "-l", "app=nothing"),
    ("get", "pods", "--field-selector", "metadata.name=demo"),
    ("get", "pods", "--chunk-size", "1"),
    ("get", "pod", "missing"),
    ("get", "namespaces"),
    ("api-resources",),
    ("api-versions",),
    ("auth", "can-i", "get", "pods"),
    ("auth", "can-i", "--list"),
    ("logs", "demo"),
    ("create", "configmap", "{side}", "--from-literal=k=v"),
    ("create", "configmap", "{side}", "--from-literal=k=v"),  # AlreadyExists
    ("get", "configmap", "{side}", "-o", "yaml"),
    ("label", "configmap", "{side}", "tier=web"),
    ("annotate", "configmap", "{side}", "note=hi"),
    ("patch", "configmap", "{side}", "--type=merge", "-p", '{"data":{"k":"w"}}'),
    ("get", "configmap", "{side}", "-o", "jsonpath={.data.k} {.metadata.labels.tier}"),
    ("delete", "configmap", "{side}"),
    ("delete", "configmap", "{side}"),  # NotFound
]


def masked(text: str) -> str:
    for pattern, replacement in _MASKS:
        text = pattern.sub(replacement, text)
    return text


@pytest.fixture
def direct(tunnel: Tunnel, tmp_path: Path) -> Kubectl:
    """kubectl straight to the stand-in, as the identity the tunnel asserts."""
    config = yaml.safe_load(tunnel.stub.kubeconfig())
    config["users"][0]["user"].update({"as": "tunnel:alice", "as-groups": ["tunnel:platform"]})
    kubeconfig = tmp_path / "direct.kc"
    kubeconfig.write_text(yaml.safe_dump(config))
    home = tmp_path / "direct-home"
    home.mkdir()
    return Kubectl(kubeconfig, home, tmp_path)


async def both(direct: Kubectl, tunnel: Tunnel, command: tuple[str, ...]) -> tuple[Result, Result]:
    results = []
    for side, kubectl in (("direct-side", direct), ("tunnel-side", tunnel.kubectl)):
        results.append(await kubectl.run(*(part.replace("{side}", side) for part in command)))
    return results[0], results[1]


async def test_kubectl_prints_the_same_through_the_tunnel_as_directly(
    tunnel: Tunnel, direct: Kubectl
) -> None:
    tunnel.stub.append_log("default", "demo", "first line\nsecond line\n")
    differences = []
    failed = []
    for command in COMMANDS:
        straight, relayed = await both(direct, tunnel, command)
        seen = [
            (relayed.returncode, masked(relayed.stdout), masked(relayed.stderr)),
            (straight.returncode, masked(straight.stdout), masked(straight.stderr)),
        ]
        if seen[0] != seen[1]:
            differences.append((command, seen))
        if relayed.returncode != 0:
            failed.append(" ".join(command[:3]))
    assert differences == []
    # Not the same for want of anything working: only the failures meant as such failed.
    assert failed == ["get pod missing", "create configmap {side}", "delete configmap {side}"]
