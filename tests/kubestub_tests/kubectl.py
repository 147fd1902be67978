"""Running the real kubectl binary as a subprocess, as a user would."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

__all__ = ["KUBECTL", "Kubectl", "Result", "Running"]

KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"
TIMEOUT = 20.0
"""Seconds any one kubectl invocation (or one awaited line of output) may take."""


@dataclass(frozen=True, slots=True)
class Result:
    """How a kubectl run ended."""

    returncode: int
    stdout: str
    stderr: str


class Running:
    """A kubectl that keeps running (``get -w``, ``logs -f``, ``port-forward``)."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    async def line(self) -> str:
        """The next line of stdout (fails the test if none comes in time)."""
        assert self.process.stdout is not None
        raw = await asyncio.wait_for(self.process.stdout.readline(), TIMEOUT)
        if not raw:
            stderr = await self._stderr()
            raise AssertionError(f"kubectl ended its output; stderr: {stderr!r}")
        return raw.decode().rstrip("\n")

    async def _stderr(self) -> str:
        assert self.process.stderr is not None
        with contextlib.suppress(TimeoutError):
            return (await asyncio.wait_for(self.process.stderr.read(), TIMEOUT)).decode()
        return ""

    async def stop(self) -> str:
        """Terminate kubectl; return what it wrote on stderr."""
        if self.process.returncode is None:
            self.process.terminate()
        stderr = await self._stderr()
        await asyncio.wait_for(self.process.wait(), TIMEOUT)
        return stderr


@dataclass(frozen=True, slots=True)
class Kubectl:
    """kubectl with its own HOME (so its discovery cache is fresh) and the stand-in's kubeconfig."""

    kubeconfig: Path
    home: Path
    workdir: Path

    def env(self) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "KUBECONFIG": str(self.kubeconfig),
            "LANG": "C",
        }

    async def run(self, *args: str, stdin: bytes | None = None) -> Result:
        """Run ``kubectl args...`` to completion."""
        process = await asyncio.create_subprocess_exec(
            KUBECTL,
            *args,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env(),
            cwd=self.workdir,
        )
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(stdin), TIMEOUT)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise AssertionError(f"kubectl {' '.join(args)} did not finish in {TIMEOUT}s") from None
        assert process.returncode is not None
        return Result(process.returncode, stdout.decode(), stderr.decode())

    async def start(self, *args: str, stdin: bool = False) -> Running:
        """Start ``kubectl args...`` and leave it running (with ``stdin``, a pipe to write to)."""
        process = await asyncio.create_subprocess_exec(
            KUBECTL,
            *args,
            stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env(),
            cwd=self.workdir,
        )
        return Running(process)

    def write(self, name: str, text: str) -> Path:
        """Write a manifest (or any file) in kubectl's working directory."""
        path = self.workdir / name
        path.write_text(text)
        return path
