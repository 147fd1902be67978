"""Writing a command's outputs into its outputs Secret; only their names leave the cluster."""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping

from tunnel_commands import OutputsSecret

from .errors import ExecutorError, KubeRequestError
from .kube import ApiResource, KubeClient
from .labels import MANAGED_BY, MANAGED_BY_VALUE

__all__ = ["SECRETS", "OutputWriter"]

SECRETS = ApiResource("", "v1", "Secret", "secrets", namespaced=True)
_KEY = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")


class OutputWriter:
    """Writes outputs into ``target`` (server-side apply, so keys no longer written go away)."""

    def __init__(self, client: KubeClient, target: OutputsSecret | None) -> None:
        self._client = client
        self.target = target

    async def write(self, outputs: Mapping[str, str]) -> list[str]:
        """Store ``outputs`` (name to text); the names stored, sorted. Nothing without a target."""
        if self.target is None or not outputs:
            return []
        for name in outputs:
            if not _KEY.fullmatch(name):
                raise ExecutorError(f"output {name[:60]!r} cannot be a Secret key")
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": self.target.name,
                "namespace": self.target.namespace,
                "labels": {MANAGED_BY: MANAGED_BY_VALUE},
            },
            "type": "Opaque",
            "data": {
                name: base64.b64encode(value.encode()).decode() for name, value in outputs.items()
            },
        }
        where = f"outputsSecret {self.target.namespace}/{self.target.name}"
        try:
            await self._client.apply(SECRETS, self.target.namespace, secret)
        except KubeRequestError as exc:
            raise ExecutorError(f"cannot write the outputs to {where}: {exc}") from exc
        return sorted(outputs)
