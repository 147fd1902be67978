"""The installed commands, run as a user runs them: tunnel-server, tunnelctl, tunnel-agent.

Real subprocesses from the virtual environment's console scripts, real TLS on
loopback. Waiting is on what the processes say (their log lines on stderr)
or on their exit, never on a sleep; every process is killed at teardown.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

BIN = Path(sys.executable).parent

#: How long a process may take to say what a test waits for.
PATIENCE = 15.0


def command(name: str) -> str:
    path = BIN / name
    assert path.exists(), f"{name} is not installed next to {sys.executable}"
    return str(path)


def clean_environment() -> dict[str, str]:
    """This environment without proxy settings or TUNNEL* variables that would change the run."""
    return {
        name: value
        for name, value in os.environ.items()
        if not name.lower().endswith("_proxy") and not name.startswith("TUNNEL")
    }


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class Service:
    """A long-running command and the lines it has written to stderr so far."""

    name: str
    process: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    ended: bool = False
    _changed: threading.Condition = field(default_factory=threading.Condition)
    _reader: threading.Thread | None = None

    def start_reading(self) -> None:
        self._reader = threading.Thread(target=self._read, name=f"{self.name} stderr")
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self.ended = True
            self._changed.notify_all()

    def wait_for(self, text: str, timeout: float = PATIENCE) -> str:
        """The first stderr line holding ``text``, once written; fail if the process ends first."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in self.lines:
                    if text in line:
                        return line
                if self.ended:
                    raise AssertionError(
                        f"{self.name} ended (exit {self.process.poll()}) without saying "
                        f"{text!r}:\n{self.output()}"
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(
                        f"{self.name} did not say {text!r} within {timeout}s:\n{self.output()}"
                    )
                self._changed.wait(remaining)

    def output(self) -> str:
        return "".join(self.lines)

    def close(self) -> None:
        """Kill the process if it still runs, and collect it and its pipe."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=PATIENCE)
        if self._reader is not None:
            self._reader.join(timeout=PATIENCE)
        if self.process.stderr is not None:
            self.process.stderr.close()


Spawn = Callable[..., Service]


@contextlib.contextmanager
def services() -> Iterator[Spawn]:
    """Start long-running commands; every one is killed and collected on exit."""
    started: list[Service] = []

    def start(name: str, *args: str) -> Service:
        process = subprocess.Popen(
            [command(name), *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=clean_environment(),
        )
        service = Service(name, process)
        started.append(service)
        service.start_reading()
        return service

    try:
        yield start
    finally:
        for service in started:
            service.close()


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    with services() as start:
        yield start


@dataclass
class ServerProcess:
    service: Service
    url: str
    state_dir: Path

    @property
    def ca(self) -> Path:
        return self.state_dir / "ca.crt"

    @property
    def admin_token_file(self) -> Path:
        return self.state_dir / "admin-token"


def start_server(spawn: Spawn, state: Path) -> ServerProcess:
    """``tunnel-server serve`` on a free loopback port, once it says it listens."""
    port = free_port()
    service = spawn(
        "tunnel-server", "serve", "--state-dir", str(state), "--listen", f"127.0.0.1:{port}"
    )
    service.wait_for("listening on")
    return ServerProcess(service, f"https://127.0.0.1:{port}", state)


@pytest.fixture
def server(spawn: Spawn, tmp_path: Path) -> ServerProcess:
    """A server of the test's own (the test may stop it)."""
    return start_server(spawn, tmp_path / "state")


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server for the tests that only ask it things, to keep the tier fast."""
    with services() as spawn:
        yield start_server(spawn, tmp_path_factory.mktemp("shared") / "state")


def tunnelctl(
    server: ServerProcess, *args: str, token: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run tunnelctl against ``server`` as its admin (or with ``token``, in its variable)."""
    environment = clean_environment()
    credentials = ["--token-file", str(server.admin_token_file)]
    if token:
        environment["TUNNELCTL_TOKEN"] = token
        credentials = []
    return subprocess.run(
        [command("tunnelctl"), "--server", server.url, "--ca", str(server.ca), *credentials, *args],
        capture_output=True,
        text=True,
        timeout=PATIENCE,
        env=environment,
        check=False,
    )


def write_kubeconfig(path: Path) -> Path:
    """A kubeconfig for the agent's Kubernetes API client; nothing is relayed in these tests."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": "http://127.0.0.1:9"}}],
        "users": [{"name": "agent", "user": {"token": "not-used"}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "agent"}}],
        "current-context": "local",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def ok(run: subprocess.CompletedProcess[str]) -> str:
    assert run.returncode == 0, run.stderr
    return run.stdout


def cluster_list(server: ServerProcess) -> list[dict[str, Any]]:
    clusters: list[dict[str, Any]] = json.loads(
        ok(tunnelctl(server, "cluster", "list", "-o", "json"))
    )
    return clusters


def one_line_error(run: subprocess.CompletedProcess[str], program: str) -> str:
    """The single stderr line of a failed run (nothing on stdout)."""
    assert run.returncode != 0
    assert run.stdout == ""
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith(f"{program}: ")
    return lines[0]


def test_register_run_agent_list_kill_and_stop(
    server: ServerProcess, spawn: Spawn, tmp_path: Path
) -> None:
    # Register the cluster: a bootstrap token and the install manifest.
    install = json.loads(ok(tunnelctl(server, "cluster", "add", "prod-eu", "-o", "json")))
    token = install["bootstrap_token"]
    assert install["cluster"]["name"] == "prod-eu"
    documents = list(yaml.safe_load_all(install["manifest"]))
    kinds = [document["kind"] for document in documents]
    assert "Deployment" in kinds
    [secret] = [d for d in documents if d["kind"] == "Secret"]
    assert secret["stringData"]["bootstrap-token"] == token
    assert secret["stringData"]["server-url"] == server.url
    assert secret["stringData"]["ca.crt"] == server.ca.read_text()

    # Run the agent outside a cluster with that token.
    token_file = tmp_path / "bootstrap-token"
    token_file.write_text(token + "\n")
    agent = spawn(
        "tunnel-agent",
        "run",
        "--server",
        server.url,
        "--ca",
        str(server.ca),
        "--cluster",
        "prod-eu",
        "--bootstrap-token-file",
        str(token_file),
        "--credentials-dir",
        str(tmp_path / "credentials"),
        "--kubeconfig",
        str(write_kubeconfig(tmp_path / "kubeconfig")),
        "--health-listen",
        "127.0.0.1:0",
    )
    health = re.search(
        r"health endpoints on 127\.0\.0\.1:(\d+)", agent.wait_for("health endpoints")
    )
    assert health is not None
    agent.wait_for("connected to")
    server.service.wait_for("agent connected")
    with urllib.request.urlopen(f"http://127.0.0.1:{health.group(1)}/readyz", timeout=5) as ready:
        assert ready.status == 200
        assert json.load(ready) == {"status": "connected", "cluster": "prod-eu"}

    [entry] = cluster_list(server)
    assert entry["name"] == "prod-eu"
    assert entry["connected"] is True
    assert entry["agent_version"] == "0.1.0"
    assert entry["remote_addr"] == "127.0.0.1"
    datetime.fromisoformat(entry["connected_since"])
    datetime.fromisoformat(entry["last_seen"])

    header, row = ok(tunnelctl(server, "cluster", "list")).splitlines()
    assert header.split() == [
        "NAME",
        "CONNECTED",
        "REPLICA",
        "AGENT",
        "REMOTE",
        "CONNECTED",
        "SINCE",
        "LAST",
        "SEEN",
    ]
    fields = row.split()
    assert fields[:2] == ["prod-eu", "yes"]
    assert fields[2] == entry["replica"]  # the server that holds the agent: this one
    assert fields[3:5] == ["0.1.0", "127.0.0.1"]

    # kill -9: no goodbye, but the TCP connection closes and the server notices at once.
    agent.process.send_signal(signal.SIGKILL)
    assert agent.process.wait(timeout=PATIENCE) == -signal.SIGKILL
    server.service.wait_for("agent disconnected")
    [entry] = cluster_list(server)
    assert entry["connected"] is False
    assert entry["connected_since"] is None
    assert entry["last_seen"] is not None
    assert entry["agent_version"] == "0.1.0"

    # SIGTERM: a graceful stop, exit status 0, within a few seconds.
    stopping = time.monotonic()
    server.service.process.send_signal(signal.SIGTERM)
    assert server.service.process.wait(timeout=PATIENCE) == 0
    assert time.monotonic() - stopping < 5.0
    server.service.wait_for("shutting down")


def test_tunnelctl_with_a_wrong_token_says_so_in_one_line(shared_server: ServerProcess) -> None:
    run = tunnelctl(shared_server, "cluster", "list", token="tat_wrong")
    line = one_line_error(run, "tunnelctl")
    assert "API token is not valid" in line
    assert "401" in line
    assert "tat_wrong" not in line


def test_tunnelctl_adding_an_existing_cluster_says_so_in_one_line(
    shared_server: ServerProcess,
) -> None:
    ok(tunnelctl(shared_server, "cluster", "add", "staging"))
    line = one_line_error(tunnelctl(shared_server, "cluster", "add", "staging"), "tunnelctl")
    assert "409" in line
    assert "staging" in line


def test_tunnel_agent_with_an_unreadable_ca_says_so_in_one_line(tmp_path: Path) -> None:
    run = subprocess.run(
        [
            command("tunnel-agent"),
            "run",
            "--server",
            "https://127.0.0.1:1",
            "--ca",
            str(tmp_path / "missing-ca.crt"),
            "--cluster",
            "prod-eu",
            "--credentials-dir",
            str(tmp_path / "credentials"),
        ],
        capture_output=True,
        text=True,
        timeout=PATIENCE,
        env=clean_environment(),
        check=False,
    )
    line = one_line_error(run, "tunnel-agent")
    assert run.returncode == 1
    assert "cannot read the CA bundle" in line
    assert "missing-ca.crt" in line


def test_tunnelctl_takes_a_token_on_the_command_line_and_warns_that_ps_shows_it(
    shared_server: ServerProcess,
) -> None:
    token = shared_server.admin_token_file.read_text().strip()
    run = tunnelctl(shared_server, "--token", token, "cluster", "list", "-o", "json")
    assert run.returncode == 0, run.stderr
    assert isinstance(json.loads(run.stdout), list)
    assert run.stderr == (
        "tunnelctl: warning: --token puts the API token on the command line, where anyone on "
        "this machine can read it (ps, /proc); use --token-file or TUNNELCTL_TOKEN instead\n"
    )


def test_tunnel_agent_warns_of_a_bootstrap_token_on_its_command_line(tmp_path: Path) -> None:
    token = "tbt_on-the-command-line"
    run = subprocess.run(
        [
            command("tunnel-agent"),
            "run",
            "--server",
            "https://127.0.0.1:1",
            "--ca",
            str(tmp_path / "missing-ca.crt"),
            "--cluster",
            "prod-eu",
            "--bootstrap-token",
            token,
            "--credentials-dir",
            str(tmp_path / "credentials"),
        ],
        capture_output=True,
        text=True,
        timeout=PATIENCE,
        env=clean_environment(),
        check=False,
    )
    assert run.returncode == 1
    warning, error = run.stderr.splitlines()
    assert "WARNING tunnel_agent: --bootstrap-token puts the token on the command line" in warning
    assert "use --bootstrap-token-file or TUNNEL_AGENT_BOOTSTRAP_TOKEN instead" in warning
    assert error.startswith("tunnel-agent: cannot read the CA bundle")
    assert token not in run.stderr
