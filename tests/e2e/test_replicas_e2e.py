"""Three real ``tunnel-server`` processes on one PostgreSQL database, a real agent and kubectl.

The agent knows only the balancer's address (tests/balancer.py, a Service with
TLS passthrough); kubectl talks to each replica directly, so that most of its
requests reach a replica that does not hold the agent and are forwarded.
SIGKILL of the owner ends what it carried with an error, and the agent serves
again from another replica within the 15 s the operations guide promises.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.balancer import Balancer, running_balancer
from tests.kubestub import KubeStub
from tests.kubestub_tests.kubectl import TIMEOUT, Kubectl
from tests.tunnel_server.store_engines import fresh_database
from tunnel_pki.ca import CertificateAuthority
from tunnel_pki.tls import client_context

from .test_cli_e2e import clean_environment, command, free_port
from .test_kubectl_tunnel import port_forward_echoes

#: Seconds a process may take to say what the test waits for.
PATIENCE = 20.0
#: The operations guide's promise: an agent whose replica died serves again within this.
FAILOVER = 15.0

pytestmark = pytest.mark.timeout(180)


@dataclass
class Process:
    """A long-running command, and what it wrote on stderr."""

    name: str
    process: asyncio.subprocess.Process
    lines: list[str] = field(default_factory=list)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _reader: asyncio.Task[None] | None = None

    async def _read(self) -> None:
        assert self.process.stderr is not None
        while raw := await self.process.stderr.readline():
            self.lines.append(raw.decode(errors="replace"))
            self._changed.set()
        self._changed.set()

    async def wait_for(self, pattern: str, *, after: int = 0) -> re.Match[str]:
        """The first stderr line from ``after`` on that matches ``pattern``."""
        regex = re.compile(pattern)
        async with asyncio.timeout(PATIENCE):
            while True:
                for line in self.lines[after:]:
                    if match := regex.search(line):
                        return match
                if self._reader is not None and self._reader.done():
                    raise AssertionError(f"{self.name} ended without {pattern!r}:\n{self.text()}")
                self._changed.clear()
                await self._changed.wait()

    def text(self) -> str:
        return "".join(self.lines)

    async def kill(self) -> None:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)
        await self.process.wait()
        if self._reader is not None:
            await self._reader


@contextlib.asynccontextmanager
async def processes() -> AsyncIterator[list[Process]]:
    started: list[Process] = []
    try:
        yield started
    finally:
        for process in started:
            await process.kill()


async def spawn(started: list[Process], name: str, *args: str) -> Process:
    process = await asyncio.create_subprocess_exec(
        command(name),
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=clean_environment(),
    )
    running = Process(name, process)
    running._reader = asyncio.create_task(running._read())
    started.append(running)
    return running


@dataclass
class Replica:
    name: str
    process: Process
    url: str


@dataclass
class Fleet:
    replicas: list[Replica]
    balancer: Balancer
    agent: Process
    stub: KubeStub
    ca: Path
    admin_token: str
    alice: Kubectl
    kubeconfig: str
    tmp_path: Path

    async def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        async with (
            aiohttp.ClientSession() as http,
            http.request(
                method,
                f"https://{self.balancer.address}{path}",
                json=body,
                headers={"Authorization": f"Bearer {self.admin_token}"},
                ssl=client_context(self.ca.read_bytes()),
            ) as response,
        ):
            text = await response.text()
            return response.status, json.loads(text) if text else None

    async def owner(self) -> Replica:
        """The replica holding the agent, once one does (the agent says it connected a
        moment before the server records the session)."""
        async with asyncio.timeout(PATIENCE):
            while True:
                status, cluster = await self.api("GET", "/api/v1/clusters/prod-eu")
                assert status == 200, cluster
                if cluster["connected"]:
                    break
        [owner] = [replica for replica in self.replicas if replica.name == cluster["replica"]]
        return owner

    def kubectl_to(self, replica: Replica) -> Kubectl:
        """alice's kubectl, pointed at ``replica`` itself rather than the balancer."""
        path = self.tmp_path / f"kc-{replica.name}.yaml"
        path.write_text(self.kubeconfig.replace(f"https://{self.balancer.address}", replica.url))
        return Kubectl(path, self.alice.home, self.alice.workdir)


async def start_replica(
    started: list[Process], tmp_path: Path, name: str, database: str, public_url: str
) -> Replica:
    port = free_port()
    process = await spawn(
        started,
        "tunnel-server",
        "serve",
        "--state-dir",
        str(tmp_path / name),
        "--listen",
        f"127.0.0.1:{port}",
        "--public-url",
        public_url,
        "--database",
        database,
        "--ca-cert",
        str(tmp_path / "ca.crt"),
        "--ca-key",
        str(tmp_path / "ca.key"),
        "--replica-name",
        name,
        "--peer-listen",
        "127.0.0.1:0",
        "--replica-lease",
        "5s",
    )
    await process.wait_for("listening on")
    return Replica(name, process, f"https://127.0.0.1:{port}")


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    ca = CertificateAuthority.create()
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    (tmp_path / "ca.key").write_bytes(ca.key_pem)
    (tmp_path / "ca.key").chmod(0o600)
    async with (
        KubeStub() as stub,
        fresh_database() as database,
        running_balancer([]) as balancer,
        processes() as started,
    ):
        stub.add_pod("demo")
        public = f"https://{balancer.address}"
        replicas = [
            await start_replica(started, tmp_path, name, database, public) for name in "abc"
        ]
        balancer.backends[:] = [
            ("127.0.0.1", int(replica.url.rsplit(":", 1)[1])) for replica in replicas
        ]
        admin_token = (tmp_path / "a" / "admin-token").read_text().strip()
        fleet = Fleet(
            replicas,
            balancer,
            replicas[0].process,
            stub,
            tmp_path / "ca.crt",
            admin_token,
            Kubectl(tmp_path / "kc.yaml", tmp_path / "home", tmp_path),
            "",
            tmp_path,
        )
        status, install = await fleet.api("POST", "/api/v1/clusters", {"name": "prod-eu"})
        assert status == 201, install
        status, _ = await fleet.api("POST", "/api/v1/users", {"name": "alice"})
        assert status == 201
        status, _ = await fleet.api("PUT", "/api/v1/grants/alice/prod-eu", {})
        assert status == 200
        status, answer = await fleet.api("POST", "/api/v1/users/alice/kubeconfig?cluster=prod-eu")
        assert status == 201, answer
        fleet.kubeconfig = answer["kubeconfig"]
        (tmp_path / "kc.yaml").write_text(fleet.kubeconfig)
        (tmp_path / "home").mkdir()
        token_file = tmp_path / "bootstrap-token"
        token_file.write_text(install["bootstrap_token"] + "\n")
        fleet.agent = await spawn(
            started,
            "tunnel-agent",
            "run",
            "--server",
            public,
            "--ca",
            str(tmp_path / "ca.crt"),
            "--cluster",
            "prod-eu",
            "--bootstrap-token-file",
            str(token_file),
            "--credentials-dir",
            str(tmp_path / "credentials"),
            "--kubeconfig",
            str(stub.write_kubeconfig(tmp_path / "agent.kc")),
            "--health-listen",
            "127.0.0.1:0",
        )
        await fleet.agent.wait_for("connected to")
        yield fleet


async def test_kubectl_gets_watches_execs_and_forwards_ports_through_any_replica(
    fleet: Fleet,
) -> None:
    owner = await fleet.owner()
    for replica in fleet.replicas:
        kubectl = fleet.kubectl_to(replica)
        pods = await kubectl.run("get", "pods", "--no-headers")
        assert pods.returncode == 0, pods.stderr
        assert pods.stdout.split()[0] == "demo"
    other = next(replica for replica in fleet.replicas if replica is not owner)
    kubectl = fleet.kubectl_to(other)
    echo = await kubectl.run("exec", "demo", "--", "echo", "through", other.name)
    assert (echo.returncode, echo.stdout) == (0, f"through {other.name}\n"), echo.stderr
    watch = await kubectl.start("get", "pods", "-w", "--no-headers")
    try:
        assert (await watch.line()).split()[0] == "demo"
        fleet.stub.add_pod("arrived-later")
        assert (await watch.line()).split()[0] == "arrived-later"
    finally:
        await watch.stop()
    await port_forward_echoes(kubectl, bytes(range(256)) * 400)


async def tunnelctl(fleet: Fleet, *args: str) -> str:
    """tunnelctl through the balancer, as the admin; its output."""
    token = fleet.tmp_path / "admin-token"
    token.write_text(fleet.admin_token + "\n")
    process = await asyncio.create_subprocess_exec(
        command("tunnelctl"),
        "--server",
        f"https://{fleet.balancer.address}",
        "--ca",
        str(fleet.ca),
        "--token-file",
        str(token),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=clean_environment(),
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), PATIENCE)
    assert process.returncode == 0, stderr.decode()
    return stdout.decode()


async def test_tunnelctl_on_any_replica_shows_every_replica_and_who_holds_the_cluster(
    fleet: Fleet,
) -> None:
    owner = await fleet.owner()
    # Through the balancer, so from any replica: each answers the same.
    for _ in fleet.replicas:
        [cluster] = json.loads(await tunnelctl(fleet, "cluster", "list", "-o", "json"))
        assert (cluster["connected"], cluster["replica"]) == (True, owner.name)
    status = json.loads(await tunnelctl(fleet, "status", "-o", "json"))
    replicas = {replica["name"]: replica for replica in status["replicas"]}
    assert set(replicas) == {"a", "b", "c"}
    assert all(replica["healthy"] for replica in replicas.values())
    assert replicas[owner.name]["agents"] == 1
    assert status["clusters"]["connected"] == 1
    text = await tunnelctl(fleet, "status")
    assert "replicas     3" in text


async def test_sigkill_of_the_owner_ends_a_watch_and_the_agent_serves_again_elsewhere(
    fleet: Fleet,
) -> None:
    owner = await fleet.owner()
    watcher = next(replica for replica in fleet.replicas if replica is not owner)
    kubectl = fleet.kubectl_to(watcher)
    watch = await kubectl.start("get", "pods", "-w", "--no-headers")
    assert (await watch.line()).split()[0] == "demo"
    seen = len(fleet.agent.lines)
    killed = time.monotonic()
    await owner.process.kill()
    # The watch, forwarded through the dead replica, ends with an error.
    assert await asyncio.wait_for(watch.process.wait(), TIMEOUT) != 0
    await fleet.agent.wait_for("connected to", after=seen)
    survivors = [replica for replica in fleet.replicas if replica is not owner]
    for replica in survivors:
        while True:
            pods = await fleet.kubectl_to(replica).run("get", "pods", "--no-headers")
            if pods.returncode == 0:
                break
            # Until the agent's new session is claimed, the 503 says it reconnects.
            assert "ServiceUnavailable" in pods.stderr or "unavailable" in pods.stderr.lower()
    assert time.monotonic() - killed < FAILOVER
    rerun = await fleet.kubectl_to(watcher).start("get", "pods", "-w", "--no-headers")
    try:
        assert (await rerun.line()).split()[0] == "demo"
    finally:
        await rerun.stop()


QUERY = {
    "apiVersion": "tunnel/v1",
    "type": "query",
    "name": "namespace",
    "spec": {"get": {"apiVersion": "v1", "kind": "Namespace", "name": "default"}},
}
#: Commands in the stream during which the owner is killed.
COMMANDS = 500


async def test_sigkill_of_the_owner_during_a_stream_of_commands_loses_none_and_runs_none_twice(
    fleet: Fleet,
) -> None:
    owner = await fleet.owner()
    ids: list[str] = []
    for index in range(COMMANDS):
        if index == COMMANDS // 5:
            await owner.process.kill()
        while True:
            status, answer = await fleet.api(
                "POST",
                "/api/v1/clusters/prod-eu/commands",
                {"spec": QUERY, "idempotency_key": f"stream-{index}"},
            )
            if status in (200, 201):
                break
            # Only the killed replica's connections fail; the balancer sends a retry elsewhere.
            assert status in (502, 503), answer
        ids.append(answer["id"])
    assert len(set(ids)) == COMMANDS
    finished: dict[str, dict[str, Any]] = {}
    async with asyncio.timeout(120):
        while len(finished) < COMMANDS:
            status, page = await fleet.api("GET", "/api/v1/commands?cluster=prod-eu&limit=1000")
            assert status == 200, page
            for record in page:
                if record["state"] not in ("pending", "delivered", "running"):
                    finished[record["id"]] = record
    assert set(finished) == set(ids)
    lost = [record for record in finished.values() if record["state"] != "succeeded"]
    if lost:
        told = [
            f"{process.name}: {line}"
            for process in [fleet.agent, *(replica.process for replica in fleet.replicas)]
            for line in process.lines
            if any(record["id"] in line or record["id"][:8] in line for record in lost)
        ]
        raise AssertionError(json.dumps(lost, indent=1) + "\n" + "".join(told))
    assert {record["attempt"] for record in finished.values()} == {1}
