"""In a cluster, a helm or tofu step runs as a Kubernetes Job, never in the agent's pod.

The code that comes with a command (a module's ``local-exec``, a provider,
a post-renderer, git) must not run where the agent's credentials are. So in a
cluster the agent runs each such step as a Job in its own namespace
(:class:`JobLauncher`): the pod mounts no ServiceAccount token
(``automountServiceAccountToken: false``), runs as a non-root user with every
capability dropped, a read-only root file system and resource limits, has a
deadline (``activeDeadlineSeconds``, the run's time left), and reaches the API
server only through the agent's gateway with the run's credential (a token
acting as the submitter until the run ends, :mod:`.gateway`). The step, its
references resolved, travels in a Secret the pod mounts
(:mod:`.jobstep`); the pod's log is followed as the step's log (masked again
here); its last line is the result. Cancelling the run, or its timeout,
deletes the Job, which stops the pod; the Secret is deleted with it.

The Job's and the Secret's own API calls are the agent's (in its namespace).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import secrets
from typing import Any

import aiohttp

from tunnel_commands import Command, HelmSpec, TofuSpec

from ..identity import AGENT
from .errors import ExecutorError, KubeRequestError
from .gateway import TofuState
from .jobspec import (
    DOCUMENT,
    JOB_LABEL,
    JobSettings,
    StepRun,
    job_manifest,
    parse_result,
    step_document,
)
from .kube import ApiResource, KubeClient
from .labels import MANAGED_BY, MANAGED_BY_VALUE
from .secrets import OutputValue
from .steps import Step, StepReport

__all__ = ["JobLauncher", "run_in_job"]

logger = logging.getLogger(__name__)

JOBS = ApiResource("batch", "v1", "Job", "jobs", namespaced=True)
PODS = ApiResource("", "v1", "Pod", "pods", namespaced=True)
SECRETS = ApiResource("", "v1", "Secret", "secrets", namespaced=True)
_FINISHED = ("Succeeded", "Failed")


async def run_in_job(settings: JobSettings, spec: HelmSpec | TofuSpec, step: Step) -> StepReport:
    """Run ``spec`` (its values resolved) as a Job of ``settings``; its log and result."""
    return await JobLauncher(settings).run(spec, step)


class JobLauncher:
    """Runs helm and tofu steps as Jobs in the agent's namespace, as the agent."""

    def __init__(self, settings: JobSettings) -> None:
        self.settings = settings

    async def run(self, spec: HelmSpec | TofuSpec, step: Step) -> StepReport:
        """Run ``spec`` (its values resolved) in a Job; its log is the step's, its result too."""
        context = step.context
        if context.gateway is None or context.deadline is None:
            raise ExecutorError(f"{step.path}: a step runs in a Job only through the gateway")
        loop = asyncio.get_running_loop()
        left = int(context.deadline - loop.time())
        client = KubeClient(context.kube, AGENT)  # the agent's own objects, in its namespace
        name = f"tunnel-run-{context.command_id[:8]}-{secrets.token_hex(4)}"
        namespace = self.settings.namespace
        state = None
        if isinstance(spec, TofuSpec):
            backend = spec.backend
            suffix = getattr(backend, "secret_suffix", None)
            if suffix is not None and (getattr(backend, "namespace", None) or namespace) == (
                namespace
            ):
                state = TofuState(namespace, suffix)
        async with context.gateway.credential(
            own_namespace=context.own_namespace,
            label=f"command {context.command_id}",
            identity=context.identity,
            expires=context.deadline,
            tofu_state=state,
        ) as token:
            document = step_document(
                StepRun(
                    command=Command(name=name, spec=spec).to_dict(),
                    kubeconfig=json.dumps(_kubeconfig(context.gateway.url, token)),
                    namespace=context.namespace,
                    own_namespace=context.own_namespace,
                    allow_file_git_sources=context.allow_file_git_sources,
                    masked=list(context.masker.values),
                    path=step.path,
                )
            )
            try:
                await self._create(client, name, document, left, context.command_id)
                return await self._follow(client, name, step)
            finally:
                await asyncio.shield(self._delete(client, name))

    async def _create(
        self, client: KubeClient, name: str, document: bytes, left: int, command_id: str
    ) -> None:
        namespace = self.settings.namespace
        job = job_manifest(name, self.settings, left, command_id)
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {MANAGED_BY: MANAGED_BY_VALUE, JOB_LABEL: name},
            },
            "type": "Opaque",
            "data": {DOCUMENT: base64.b64encode(document).decode()},
        }
        try:
            # The Secret first: the pod mounts it as it starts.
            await client.request("POST", SECRETS.path(namespace), body=secret)
            created = await client.request("POST", JOBS.path(namespace), body=job)
            # Collected with the Job, should the agent not delete it (a restart).
            owner = {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": name,
                "uid": created["metadata"]["uid"],
            }
            await client.request(
                "PATCH",
                SECRETS.path(namespace, name),
                body={"metadata": {"ownerReferences": [owner]}},
                content_type="application/merge-patch+json",
            )
        except KubeRequestError as exc:
            raise ExecutorError(f"cannot start the run's Job {namespace}/{name}: {exc}") from exc

    async def _follow(self, client: KubeClient, name: str, step: Step) -> StepReport:
        pod = await self._pod(client, name, step)
        result: dict[str, Any] | None = None
        async for line in self._log(client, pod):
            parsed = parse_result(line)
            if parsed is not None:
                result = parsed
            else:
                step.emit(line)
        if result is None:
            finished = await self._finished(client, pod, step)
            raise ExecutorError(f"{step.path}: the run's pod ended ({finished}) with no result")
        return _report(result, step)

    async def _pod(self, client: KubeClient, name: str, step: Step) -> str:
        """The name of the Job's pod, once it runs or has ended."""
        namespace = self.settings.namespace
        while True:
            pods = await client.list(PODS, namespace, label_selector=f"{JOB_LABEL}={name}")
            for pod in pods:
                status = pod.get("status") or {}
                if status.get("phase") in ("Running", *_FINISHED):
                    return str(pod["metadata"]["name"])
                for container in status.get("containerStatuses") or []:
                    waiting = (container.get("state") or {}).get("waiting") or {}
                    if waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff"):
                        raise ExecutorError(
                            f"{step.path}: the run's pod cannot start: {waiting.get('reason')}"
                        )
            await asyncio.sleep(step.context.poll_interval)

    async def _log(self, client: KubeClient, pod: str) -> Any:
        """The pod's log lines as they come (``follow``)."""
        kube = client.kube
        path = PODS.path(self.settings.namespace, pod) + "/log?container=step&follow=true"
        headers = {}
        authorization = await kube.authorization()
        if authorization:
            headers["Authorization"] = authorization
        try:
            async with kube.session.get(kube.url(path), headers=headers) as response:
                if response.status != 200:
                    raise ExecutorError(f"cannot follow the run's log: HTTP {response.status}")
                buffer = b""
                async for chunk in response.content.iter_any():
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        yield line.decode("utf-8", "replace")
                if buffer:
                    yield buffer.decode("utf-8", "replace")
        except (aiohttp.ClientError, OSError) as exc:
            raise ExecutorError(f"cannot follow the run's log: {exc}") from exc

    async def _finished(self, client: KubeClient, pod: str, step: Step) -> str:
        try:
            found = await client.get(PODS, self.settings.namespace, pod)
        except KubeRequestError as exc:
            return f"unknown: {exc.detail}"
        for container in (found.get("status") or {}).get("containerStatuses") or []:
            terminated = (container.get("state") or {}).get("terminated")
            if terminated:
                return f"exit {terminated.get('exitCode')}"
        return str((found.get("status") or {}).get("phase") or "unknown")

    async def _delete(self, client: KubeClient, name: str) -> None:
        """Delete the Job (its pod stops) and its Secret; gone already is fine."""
        namespace = self.settings.namespace
        for resource in (JOBS, SECRETS):
            try:
                await client.request(
                    "DELETE",
                    resource.path(namespace, name),
                    params={"propagationPolicy": "Background"},
                )
            except KubeRequestError as exc:
                if exc.status != 404:
                    logger.warning("cannot delete the run's %s %s: %s", resource.kind, name, exc)


def _report(result: dict[str, Any], step: Step) -> StepReport:
    outputs: dict[str, OutputValue] = {}
    for key, entry in (result.get("outputs") or {}).items():
        if isinstance(entry, dict) and "value" in entry:
            output = OutputValue(entry["value"], bool(entry.get("sensitive")))
            if output.sensitive:
                step.context.masker.add(output.as_text())
                _mask(step, output.value)
            outputs[str(key)] = output
    summary = result.get("summary")
    error = result.get("error")
    if summary is None:
        raise ExecutorError(str(error or f"{step.path}: the run failed"))
    return StepReport(
        summary if isinstance(summary, dict) else {}, outputs, str(error) if error else None
    )


def _mask(step: Step, value: Any) -> None:
    if isinstance(value, str):
        step.context.masker.add(value)
    elif isinstance(value, dict):
        for item in value.values():
            _mask(step, item)
    elif isinstance(value, list):
        for item in value:
            _mask(step, item)


def _kubeconfig(server: str, token: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "cluster", "cluster": {"server": server}}],
        "users": [{"name": "command", "user": {"token": token}}],
        "contexts": [{"name": "command", "context": {"cluster": "cluster", "user": "command"}}],
        "current-context": "command",
    }
