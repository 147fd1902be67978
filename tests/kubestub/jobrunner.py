"""Job pods run as local processes: what the stand-in's kubelet does, when switched on.

``stub.jobs.enabled = True`` makes every pod a Job owns run its first
container's ``command`` (or :attr:`JobPods.image_entrypoint`) + ``args`` as a
local process, as a kubelet would
run it in the image: the environment is the container's ``env`` over
:attr:`JobPods.image_environment` (the image's own, such as ``PATH``);
``secret`` and ``emptyDir`` volumes become directories, and each mount path
in the arguments and the environment's values is replaced by its directory.
Standard output and error are the container's log (``kubectl logs -f``
follows it); the exit ends the pod (``Succeeded`` or ``Failed``, with the
exit code) and its Job (``Complete`` or ``Failed``). Deleting the pod (or its
Job) kills every process of the pod, as its container's end would: each
carries :data:`POD_MARK` in its environment, and is found by it in ``/proc``.
Every pod spec given is kept in :attr:`specs`, every Job in :attr:`jobs`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any

from tests.kubestub.kinds import require_kind
from tests.kubestub.logs import LogBook
from tests.kubestub.store import Store, WatchEvent, now_rfc3339

__all__ = ["POD_MARK", "JobPods"]

#: The environment variable that marks a pod's processes (its value: the pod's uid).
POD_MARK = "KUBESTUB_POD"

PODS = require_kind("", "v1", "pods")
JOBS = require_kind("batch", "v1", "jobs")
SECRETS = require_kind("", "v1", "secrets")


class JobPods:
    """Runs Job pods' containers as local processes (off unless :attr:`enabled`)."""

    def __init__(self, store: Store, logs: LogBook) -> None:
        self._store = store
        self._logs = logs
        self.enabled = False
        #: What the image sets (PATH ...), under the container's own env.
        self.image_environment: dict[str, str] = {"PATH": os.environ.get("PATH", os.defpath)}
        #: The image's entry point, for a container that names no command.
        self.image_entrypoint: list[str] = []
        #: Every Job pod's spec, as given.
        self.specs: list[dict[str, Any]] = []
        #: Every Job, as created.
        self.jobs: list[dict[str, Any]] = []
        self._processes: dict[str, asyncio.subprocess.Process] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        store.listeners.append(self._on_event)

    def _on_event(self, event: WatchEvent) -> None:
        if event.kind is JOBS and event.type == "ADDED" and self.enabled:
            self.jobs.append(copy.deepcopy(event.obj))
        if event.kind is not PODS or not self.enabled:
            return
        meta = event.obj["metadata"]
        if event.type == "DELETED":
            if self._processes.pop(meta["uid"], None) is not None:
                _kill_pod(meta["uid"])
            return
        owners = [ref for ref in meta.get("ownerReferences") or [] if ref.get("kind") == "Job"]
        if event.type != "ADDED" or not owners:
            return
        self.specs.append(copy.deepcopy(event.obj["spec"]))
        task = asyncio.get_running_loop().create_task(self._run(copy.deepcopy(event.obj)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Kill what still runs."""
        for uid in list(self._processes):
            _kill_pod(uid)
        # Each run reads its process's output to the end and reaps it.
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=10)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _run(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        namespace, uid = meta["namespace"], meta["uid"]
        container = pod["spec"]["containers"][0]
        with tempfile.TemporaryDirectory(prefix="kubestub-pod-") as root:
            mounts = self._volumes(pod, Path(root), namespace)

            def local(value: str) -> str:
                for mount, directory in mounts.items():
                    if value == mount or value.startswith(mount + "/"):
                        return directory + value[len(mount) :]
                return value

            entrypoint = container.get("command") or self.image_entrypoint
            argv = [local(str(a)) for a in [*entrypoint, *container.get("args", [])]]
            environment = dict(self.image_environment) | {POD_MARK: meta["uid"]}
            for variable in container.get("env") or []:
                if "value" in variable:
                    environment[variable["name"]] = local(str(variable["value"]))
            found = shutil.which(argv[0], path=environment.get("PATH"))
            name = container["name"]
            if found is None:
                self._logs.append(uid, name, f"exec: {argv[0]!r}: not found")
                self._logs.close(uid, name)
                self._ended(pod, 127)
                return
            process = await asyncio.create_subprocess_exec(
                found,
                *argv[1:],
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=environment,
                cwd=root,
                start_new_session=True,
            )
            self._processes[uid] = process
            assert process.stdout is not None
            try:
                while line := await process.stdout.readline():
                    self._logs.append(uid, name, line.decode("utf-8", "replace").rstrip("\n"))
                code = await process.wait()
            finally:
                self._logs.close(uid, name)
                self._processes.pop(uid, None)
                if process.returncode is None:
                    # Cancelled: the container ends with its pod, and is reaped.
                    _kill_pod(uid)
                    await asyncio.shield(process.wait())
            self._ended(pod, code)

    def _volumes(self, pod: dict[str, Any], root: Path, namespace: str) -> dict[str, str]:
        """Each mount path of the first container, and the directory standing for it."""
        directories: dict[str, Path] = {}
        for volume in pod["spec"].get("volumes") or []:
            directory = root / "volumes" / volume["name"]
            directory.mkdir(parents=True)
            secret = volume.get("secret")
            if secret is not None:
                found = self._store.find(SECRETS, namespace, secret["secretName"])
                for key, value in ((found or {}).get("data") or {}).items():
                    (directory / key).write_bytes(base64.b64decode(value))
            directories[volume["name"]] = directory
        mounts = {}
        for mount in pod["spec"]["containers"][0].get("volumeMounts") or []:
            directory = directories.get(mount["name"])
            if directory is not None:
                mounts[mount["mountPath"].rstrip("/")] = str(directory)
        # Longest first: /run/a/b before /run/a.
        return dict(sorted(mounts.items(), key=lambda item: -len(item[0])))

    def _ended(self, pod: dict[str, Any], code: int) -> None:
        meta = pod["metadata"]
        current = self._store.find(PODS, meta["namespace"], meta["name"])
        if current is None:
            return  # deleted meanwhile
        status = current.setdefault("status", {})
        status["phase"] = "Succeeded" if code == 0 else "Failed"
        now = now_rfc3339()
        for entry in status.get("containerStatuses") or []:
            entry["ready"] = False
            entry["started"] = False
            entry["state"] = {
                "terminated": {
                    "exitCode": code,
                    "reason": "Completed" if code == 0 else "Error",
                    "startedAt": now,
                    "finishedAt": now,
                }
            }
        self._store.update(PODS, current, check_version=False)
        for ref in meta.get("ownerReferences") or []:
            job = self._store.find(JOBS, meta["namespace"], ref["name"])
            if job is None:
                continue
            succeeded = code == 0
            job["status"] = {
                "succeeded" if succeeded else "failed": 1,
                "conditions": [{"type": "Complete" if succeeded else "Failed", "status": "True"}],
            }
            self._store.update(JOBS, job, check_version=False)


def _kill_pod(uid: str) -> None:
    """SIGKILL every process carrying the pod's mark, until none is left (a fork meanwhile)."""
    needle = f"{POD_MARK}={uid}".encode()
    for _ in range(20):
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            with contextlib.suppress(OSError):
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if not found:
            return
