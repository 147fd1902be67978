"""A run harness for the executor tests: a stand-in API server, a KubeApi, a context.

``async with harness(tmp_path) as h:`` starts :class:`tests.kubestub.server.KubeStub`,
writes its kubeconfig, builds the agent's :class:`KubeApi` from it through
``load_kube_configuration`` (as the agent does), and makes execution contexts
whose log lines are kept in ``h.lines``; ``h.line_seen(text)`` is an event set
when a line containing ``text`` is logged (to synchronise on a process's output).
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.kubestub.server import KubeStub
from tunnel_agent.executors import ExecutionContext
from tunnel_agent.executors.gateway import CommandsGateway
from tunnel_agent.kubeapi import KubeApi, load_kube_configuration
from tunnel_commands import Command, parse_command

__all__ = ["Harness", "command", "harness"]


@dataclass
class Harness:
    stub: KubeStub
    kube: KubeApi
    kubeconfig: Path
    root: Path
    gateway: CommandsGateway
    lines: list[str] = field(default_factory=list)
    _waiters: dict[str, asyncio.Event] = field(default_factory=dict)
    _runs: int = 0

    def log(self, line: str) -> None:
        self.lines.append(line)
        for text, event in self._waiters.items():
            if text in line:
                event.set()

    def line_seen(self, text: str) -> asyncio.Event:
        """An event set once a logged line contains ``text``."""
        event = self._waiters.setdefault(text, asyncio.Event())
        if any(text in line for line in self.lines):
            event.set()
        return event

    def context(
        self, environment: dict[str, str] | None = None, **options: Any
    ) -> ExecutionContext:
        """A context for one run: a fresh work directory, the stub's kubeconfig."""
        self._runs += 1
        workdir = self.root / f"run-{self._runs}"
        workdir.mkdir(mode=0o700)
        options.setdefault("kubeconfig", self.kubeconfig)
        options.setdefault("gateway", self.gateway)
        if environment is not None:
            options["environment"] = environment
        return ExecutionContext(
            command_id=f"cmd-{self._runs}",
            attempt=1,
            kube=self.kube,
            workdir=workdir,
            log=self.log,
            **options,
        )

    def add_secret(self, namespace: str, name: str, data: dict[str, str]) -> None:
        self.stub.add(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": name, "namespace": namespace},
                "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
            }
        )

    def secret_data(self, namespace: str, name: str) -> dict[str, str] | None:
        """A Secret's data, decoded, or None if there is no such Secret."""
        secret = self.stub.get("v1", "Secret", name, namespace)
        if secret is None:
            return None
        return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}

    def log_text(self) -> str:
        return "\n".join(self.lines)


@asynccontextmanager
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    async with KubeStub() as stub:
        kubeconfig = stub.write_kubeconfig(tmp_path / "kubeconfig")
        kube = KubeApi(await load_kube_configuration(kubeconfig))
        root = tmp_path / "runs"
        root.mkdir()
        gateway = CommandsGateway(kube)
        try:
            yield Harness(stub, kube, kubeconfig, root, gateway)
        finally:
            await gateway.close()
            await kube.close()


def command(type_: str, spec: dict[str, Any], **envelope: Any) -> Command:
    """A validated command of ``type_`` named ``web-app``."""
    return parse_command(
        {"apiVersion": "tunnel/v1", "type": type_, "name": "web-app", **envelope, "spec": spec}
    )
