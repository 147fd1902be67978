"""The stand-in as a process and a server: standalone entry point, clean shutdown."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import aiohttp

from tests.kubestub import KubeStub
from tunnel_pki.tls import client_context

from .kubectl import KUBECTL, TIMEOUT

ROOT = Path(__file__).resolve().parents[2]


async def test_stopping_ends_open_watches_and_log_follows() -> None:
    async with KubeStub() as stub, aiohttp.ClientSession() as session:
        stub.add_pod("demo")
        headers = {"Authorization": f"Bearer {stub.token}"}
        ssl = client_context(stub.ca_pem)
        watch = await session.get(f"{stub.url}/api/v1/pods?watch=1", headers=headers, ssl=ssl)
        follow = await session.get(
            f"{stub.url}/api/v1/namespaces/default/pods/demo/log?follow=true",
            headers=headers,
            ssl=ssl,
        )
        assert (watch.status, follow.status) == (200, 200)
        await asyncio.wait_for(watch.content.readline(), TIMEOUT)
        await asyncio.wait_for(stub.stop(), TIMEOUT)
        assert await asyncio.wait_for(watch.content.read(), TIMEOUT) == b""
        assert await asyncio.wait_for(follow.content.read(), TIMEOUT) == b""
        watch.release()
        follow.release()


async def test_python_m_tests_kubestub_serves_and_writes_a_kubeconfig(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    server = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.kubestub",
        "--kubeconfig-out",
        str(kubeconfig),
        "--pod",
        "alpha",
        stdout=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    try:
        assert server.stdout is not None
        line = await asyncio.wait_for(server.stdout.readline(), TIMEOUT)
        assert line.startswith(b"kubestub serving on https://127.0.0.1:")
        await asyncio.wait_for(server.stdout.readline(), TIMEOUT)
        kubectl = await asyncio.create_subprocess_exec(
            KUBECTL,
            "get",
            "pods",
            "-o",
            "name",
            stdout=asyncio.subprocess.PIPE,
            env={
                "PATH": os.environ.get("PATH", ""),
                "HOME": str(tmp_path),
                "KUBECONFIG": str(kubeconfig),
            },
        )
        output, _ = await asyncio.wait_for(kubectl.communicate(), TIMEOUT)
        assert output == b"pod/alpha\n"
    finally:
        server.terminate()
        assert await asyncio.wait_for(server.wait(), TIMEOUT) == 0
