"""A module's code never finds the agent's credentials, and its own credential is the run's only.

A real ``terraform`` applies a module whose ``local-exec`` looks for the
agent's token (the ServiceAccount's file, whatever its environment names) and
then uses the credential it was given: as its submitter, as someone else, and
after the run.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.fakebin.support import Harness, command, harness
from tests.tunnel_agent.file_sources import allowing_file_sources
from tunnel_agent.executors import execute, subprocess_environment
from tunnel_agent.executors.process import MARK_VARIABLE
from tunnel_agent.identity import RunIdentity

ALICE = RunIdentity("tunnel:alice", ("tunnel:dev",))
SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"

PROBE = """
import json, os, sys, urllib.error, urllib.request
from pathlib import Path

out = Path(sys.argv[1])
found = {"env": dict(os.environ), "files": {}}
for name in [SERVICE_ACCOUNT_TOKEN] + [v for v in os.environ.values() if v.startswith("/")]:
    try:
        found["files"][name] = Path(name).read_text()
    except OSError as exc:
        found["files"][name] = f"unreadable: {exc.strerror}"
config = json.loads(Path(os.environ["KUBECONFIG"]).read_text())
server = config["clusters"][0]["cluster"]["server"]
token = config["users"][0]["user"]["token"]

def call(path, **headers):
    request = urllib.request.Request(
        server + path, headers={"Authorization": "Bearer " + token, **headers}
    )
    try:
        with urllib.request.urlopen(request) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())

found["own"] = call("/api/v1/namespaces/web/configmaps")
found["secret"] = call("/api/v1/namespaces/vault/secrets/db")
found["as_bob"] = call("/api/v1/namespaces/vault/secrets/db", **{"Impersonate-User": "tunnel:bob"})
found["server"], found["token"] = server, token
out.write_text(json.dumps(found))
"""


def _module(python: str, probe: Path, out: Path) -> str:
    return (
        'resource "terraform_data" "probe" {\n'
        '  provisioner "local-exec" {\n'
        f'    command = "{python} {probe} {out}"\n'
        "  }\n"
        "}\n"
    )


@pytest.fixture
async def h(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Harness]:
    if shutil.which("terraform") is None and os.environ.get("TUNNEL_TEST_NO_TERRAFORM") == "1":
        pytest.skip("TUNNEL_TEST_NO_TERRAFORM=1: the real terraform tests are turned off")
    async with harness(tmp_path) as running:
        allowing_file_sources(running, monkeypatch)
        for namespace in ("web", "vault"):
            running.stub.add(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
            )
        running.add_secret("vault", "db", {"password": "s3cr3t"})
        yield running


def _repository(path: Path, text: str) -> str:
    path.mkdir()
    (path / "main.tf").write_text(text)
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@example.com", "-C", str(path)]
    subprocess.run(["git", "init", "--quiet", "-b", "main", str(path)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "--quiet", "-m", "probe"], check=True)
    return f"file://{path}"


async def test_a_modules_local_exec_finds_no_agent_credential_and_acts_only_as_its_submitter(
    h: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the agent's own environment holds in a cluster, and its settings.
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setenv("TUNNEL_AGENT_BOOTSTRAP_TOKEN", "tbt_the-agents-bootstrap-token")
    monkeypatch.setenv("TUNNEL_AGENT_KUBECONFIG", str(h.kubeconfig))
    h.stub.deny("tunnel:alice", "get", "secrets", namespace="vault")
    probe, out = tmp_path / "probe.py", tmp_path / "found.json"
    probe.write_text(f"SERVICE_ACCOUNT_TOKEN = {SERVICE_ACCOUNT_TOKEN!r}\n" + PROBE)
    url = _repository(tmp_path / "repository", _module(sys.executable, probe, out))
    environment = subprocess_environment() | {
        "HOME": str(tmp_path),
        "TF_CLI_CONFIG_FILE": os.devnull,
    }
    spec = {"git": {"url": url, "ref": "main"}, "backend": {"local": True}}
    result = await execute(command("tofu", spec), h.context(environment, identity=ALICE))
    assert result.outcome == "succeeded", (result.error, h.lines[-20:])
    found: dict[str, Any] = json.loads(out.read_text())

    agent_token = str(await h.kube.authorization()).removeprefix("Bearer ")
    assert agent_token not in json.dumps(found)
    assert str(h.kubeconfig) not in json.dumps(found)
    # Of the agent's settings only the mark that finds a run's strays (a random value).
    assert [name for name in found["env"] if name.startswith("TUNNEL_")] == [MARK_VARIABLE]
    assert "KUBERNETES_SERVICE_HOST" not in found["env"]
    assert found["files"][SERVICE_ACCOUNT_TOKEN].startswith("unreadable")
    # Its credential: the gateway, as alice in her groups, and no one else.
    assert found["own"][0] == 200
    status, refusal = found["secret"]
    assert status == 403
    assert 'User "tunnel:alice" cannot get resource "secrets"' in refusal["message"]
    status, refusal = found["as_bob"]
    assert status == 403
    assert "may not impersonate anyone" in refusal["message"]
    seen = h.stub.requests.matching(lambda r: r.path == "/api/v1/namespaces/web/configmaps")
    assert [r.header_values("Impersonate-User") for r in seen] == [["tunnel:alice"]]
    assert [r.header_values("Impersonate-Group") for r in seen] == [["tunnel:dev"]]
    assert not h.stub.requests.matching(lambda r: r.header("Impersonate-User") == "tunnel:bob")
    # The run is over: its credential no longer works.
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            found["server"] + "/api/v1/namespaces/web/configmaps",
            headers={"Authorization": f"Bearer {found['token']}"},
        ) as response,
    ):
        assert response.status == 401


async def test_cancelling_a_run_stops_it_and_forgets_its_credential(
    h: Harness, tmp_path: Path
) -> None:
    from tests.fakebin import fake_environment, process_gone, wait_gone
    from tests.tunnel_agent.test_executors_tofu import make_repository

    url = make_repository(tmp_path / "repository")
    pids_file = tmp_path / "pids.json"
    environment = fake_environment(
        tmp_path / "r.jsonl", FAKEBIN_HANG="apply", FAKEBIN_PIDS=str(pids_file)
    )
    spec = {"git": {"url": url, "ref": "main", "path": "infra"}}
    task = asyncio.create_task(
        execute(command("tofu", spec), h.context(environment, kill_grace=0.2, identity=ALICE))
    )
    await h.line_seen("hanging").wait()
    assert h.gateway.grants == 1
    pids = json.loads(pids_file.read_text())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert h.gateway.grants == 0
    assert process_gone(pids["pid"])
    assert await wait_gone(pids["child"])


async def test_a_run_past_its_timeout_is_stopped_and_its_credential_forgotten(
    h: Harness, tmp_path: Path
) -> None:
    from tests.fakebin import fake_environment
    from tests.tunnel_agent.test_executors_tofu import make_repository

    url = make_repository(tmp_path / "repository")
    environment = fake_environment(tmp_path / "r.jsonl", FAKEBIN_HANG="apply")
    spec = {"git": {"url": url, "ref": "main", "path": "infra"}}
    result = await execute(
        command("tofu", spec, timeout="1s"),
        h.context(environment, kill_grace=0.2, identity=ALICE),
    )
    assert (result.outcome, result.error) == ("failed", "timed out after 1s")
    assert h.gateway.grants == 0
