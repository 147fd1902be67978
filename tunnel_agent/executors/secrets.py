"""Reading the values that ``secretRef`` and ``outputRef`` stand for, inside the cluster.

:class:`SecretResolver` reads Kubernetes Secrets (each once per run) and
registers every value it hands out with the run's masker, so no log line or
message shows it. :class:`ValueResolver` turns a spec value into plain JSON,
references replaced by what they stand for.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tunnel_commands import OutputRef, SecretRef, Value
from tunnel_commands.errors import join_path

from .errors import ExecutorError, KubeRequestError
from .kube import ApiResource, KubeClient
from .masking import Masker

__all__ = ["OutputValue", "SecretResolver", "ValueResolver"]


@dataclass(frozen=True, slots=True)
class OutputValue:
    """One output of a step: its JSON value and whether the tool marked it sensitive."""

    value: Any
    sensitive: bool = False

    def as_text(self) -> str:
        """Strings as they are, anything else as JSON."""
        return self.value if isinstance(self.value, str) else json.dumps(self.value)


_SECRETS = ApiResource("", "v1", "Secret", "secrets", namespaced=True)


class SecretResolver:
    """Reads keys of Secrets as the command's identity, caching each Secret for the run.

    A submitter who may not read a Secret cannot reference it: the read goes
    to the API server as they (``client``'s identity), and its refusal fails
    the command before anything is written.
    """

    def __init__(
        self,
        kube: KubeClient,
        masker: Masker,
        check_not_own: Callable[[str | None, str], None] = lambda namespace, path: None,
    ) -> None:
        self._kube = kube
        self._masker = masker
        #: Raises for a namespace commands may not read (ExecutionContext.check_not_own).
        self._check_not_own = check_not_own
        self._cache: dict[tuple[str, str], dict[str, str]] = {}

    async def get(self, ref: SecretRef, path: str) -> str:
        """The text of ``ref``'s key; ``path`` (the spec field) names it in errors."""
        self._check_not_own(ref.namespace, path)
        data = self._cache.get((ref.namespace, ref.name))
        if data is None:
            data = await self._read(ref, path)
            self._cache[(ref.namespace, ref.name)] = data
        encoded = data.get(ref.key)
        where = f"secret {ref.namespace}/{ref.name}"
        if encoded is None:
            raise ExecutorError(f"{path}: {where} has no key {ref.key!r}")
        try:
            value = base64.b64decode(encoded, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise ExecutorError(f"{path}: key {ref.key!r} of {where} is not UTF-8 text") from exc
        self._masker.add(value)
        return value

    async def _read(self, ref: SecretRef, path: str) -> dict[str, str]:
        where = f"secret {ref.namespace}/{ref.name}"
        identity = self._kube.identity
        try:
            secret = await self._kube.get(_SECRETS, ref.namespace, ref.name)
        except KubeRequestError as exc:
            if exc.status == 404:
                raise ExecutorError(f"{path}: {where} not found") from exc
            if exc.status == 403:
                why = (
                    f"the agent may not read {where} (HTTP 403); grant it get on secrets"
                    if identity.as_agent
                    else f"{identity.describe()} may not get {where} (HTTP 403): the command "
                    "acts as its submitter, and the cluster's RBAC refused get on secrets there"
                )
                raise ExecutorError(f"{path}: {why}") from exc
            if exc.status == 0:
                raise ExecutorError(f"{path}: {exc}") from exc
            raise ExecutorError(f"{path}: cannot read {where}: HTTP {exc.status}") from exc
        data = secret.get("data") if isinstance(secret, dict) else None
        return {str(k): str(v) for k, v in (data or {}).items()}


class ValueResolver:
    """Plain JSON from spec values: ``secretRef`` read, ``outputRef`` looked up.

    ``outputs`` maps each finished step of a flow to its outputs; output
    values marked sensitive are registered with the masker when used.
    """

    def __init__(
        self,
        secrets: SecretResolver,
        masker: Masker,
        outputs: Mapping[str, Mapping[str, OutputValue]] | None = None,
    ) -> None:
        self.secrets = secrets
        self.masker = masker
        self.outputs: Mapping[str, Mapping[str, OutputValue]] = {} if outputs is None else outputs

    async def resolve(self, value: Value, path: str) -> Any:
        if isinstance(value, SecretRef):
            return await self.secrets.get(value, path)
        if isinstance(value, OutputRef):
            return self._output(value, path)
        if isinstance(value, dict):
            return {
                key: await self.resolve(item, join_path(path, key)) for key, item in value.items()
            }
        if isinstance(value, list):
            return [await self.resolve(item, join_path(path, i)) for i, item in enumerate(value)]
        return value

    def _output(self, ref: OutputRef, path: str) -> Any:
        step = self.outputs.get(ref.step)
        if step is None:
            raise ExecutorError(f"{path}: step {ref.step!r} gave no outputs (did it fail?)")
        output = step.get(ref.output)
        if output is None:
            raise ExecutorError(f"{path}: step {ref.step!r} has no output {ref.output!r}")
        if output.sensitive:
            self.masker.add(output.as_text())
        return output.value
