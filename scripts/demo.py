"""The main job, end to end on this machine (run by ``bash scripts/demo``).

It starts a stand-in Kubernetes API server (the "private cluster"), a real
``tunnel-server`` and a real ``tunnel-agent`` as separate processes on
loopback; registers the cluster and bootstraps the agent with its one-time
token; creates a user with a grant and a kubeconfig; runs the real
``kubectl`` through the tunnel; dispatches a command over the same socket;
and shows the audit trail and fleet status, and where the web console is and
how to sign in. Everything is cleaned up at the end, even on failure (with
``--keep``, only once Ctrl-C is pressed, so that the console can be looked at).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
STEP_TIMEOUT = 60.0


def main() -> int:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        print("demo: kubectl is not on PATH; install it to see kubectl through the tunnel")
        return 2
    work = Path(tempfile.mkdtemp(prefix="tunnel-demo-"))
    services: list[Service] = []
    try:
        return run(work, kubectl, services)
    except DemoError as exc:
        print(f"\ndemo: FAILED: {exc}", file=sys.stderr)
        for service in services:
            service.drain()
            print(f"--- last output of {service.name} ---", file=sys.stderr)
            for line in service.last_lines:
                print(f"  {line}", file=sys.stderr)
        return 1
    finally:
        stop_all(services)
        shutil.rmtree(work, ignore_errors=True)


class DemoError(Exception):
    pass


@dataclass
class Service:
    """A process the demo started, with the last lines it wrote."""

    name: str
    process: subprocess.Popen[str]
    last_lines: deque[str] = field(default_factory=lambda: deque(maxlen=30))

    def drain(self) -> None:
        for line in lines(self, time.monotonic() + 1.0):
            self.last_lines.append(line.rstrip())


def run(work: Path, kubectl: str, processes: list[Service]) -> int:
    port = free_port()
    server_url = f"https://127.0.0.1:{port}"
    state = work / "state"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    section("1. A private cluster: the Kubernetes API stand-in on loopback")
    stub = start(
        [
            sys.executable,
            "-m",
            "tests.kubestub",
            "--kubeconfig-out",
            str(work / "cluster.kc"),
            "--pod",
            "demo",
            "--pod",
            "web",
        ],
        env,
        processes,
    )
    wait_for_line(stub, "kubestub serving on")

    section("2. The tunnel server (one TLS port: agents, bootstrap, API, kubectl)")
    server = start(
        [
            str(BIN / "tunnel-server"),
            "serve",
            "--state-dir",
            str(state),
            "--listen",
            f"127.0.0.1:{port}",
            "--public-url",
            server_url,
        ],
        env,
        processes,
    )
    wait_for_line(server, "listening on")
    ctl_env = {
        **env,
        "TUNNELCTL_SERVER": server_url,
        "TUNNELCTL_CA": str(state / "ca.crt"),
        "TUNNELCTL_TOKEN_FILE": str(state / "admin-token"),
    }

    section("3. Register the cluster; the install manifest carries a one-time token")
    added = json.loads(
        shell([str(BIN / "tunnelctl"), "cluster", "add", "demo", "-o", "json"], ctl_env, quiet=True)
    )
    print(
        f"   manifest: {len(added['manifest'].splitlines())} lines of YAML "
        f"(Namespace, RBAC, Secret, Deployment...); token expires {added['expires_at']}"
    )
    token_file = work / "bootstrap-token"
    token_file.write_text(added["bootstrap_token"])

    section("4. The agent: bootstraps, then keeps one outbound mTLS WebSocket")
    agent = start(
        [
            str(BIN / "tunnel-agent"),
            "run",
            "--server",
            server_url,
            "--ca",
            str(state / "ca.crt"),
            "--cluster",
            "demo",
            "--bootstrap-token-file",
            str(token_file),
            "--credentials-dir",
            str(work / "agent-creds"),
            "--kubeconfig",
            str(work / "cluster.kc"),
            "--health-listen",
            "127.0.0.1:0",
        ],
        env,
        processes,
    )
    wait_for_line(agent, "connected to")
    shell([str(BIN / "tunnelctl"), "cluster", "list"], ctl_env)

    section("5. A user with a grant, and a kubeconfig pointing through the tunnel")
    shell(
        [str(BIN / "tunnelctl"), "user", "add", "alice", "--group", "platform"], ctl_env, quiet=True
    )
    shell([str(BIN / "tunnelctl"), "grant", "alice", "--cluster", "demo", "--commands"], ctl_env)
    kubeconfig = work / "alice.kc"
    kubeconfig.write_text(
        shell(
            [str(BIN / "tunnelctl"), "kubeconfig", "--cluster", "demo", "--user", "alice"],
            ctl_env,
            quiet=True,
        )
    )
    print(f"   kubeconfig: server {server_url}/k8s/clusters/demo, alice's token, the server CA")

    section("6. The real kubectl, through the tunnel")
    kube_env = {**env, "KUBECONFIG": str(kubeconfig), "HOME": str(work / "home")}
    (work / "home").mkdir()
    shell([kubectl, "get", "pods", "-A"], kube_env)
    shell([kubectl, "auth", "whoami"], kube_env)
    manifest = work / "settings.yaml"
    manifest.write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: default}\n"
        "data: {colour: blue}\n"
    )
    shell([kubectl, "apply", "-f", str(manifest)], kube_env)
    shell([kubectl, "exec", "demo", "--", "sh", "-c", "echo hello from inside the pod"], kube_env)
    shell([kubectl, "delete", "configmap", "settings"], kube_env)

    section("7. A command dispatched over the same socket")
    command = work / "query.yaml"
    command.write_text(
        "apiVersion: tunnel/v1\ntype: query\nname: list-pods\ntimeout: 1m\n"
        "spec:\n  get: {apiVersion: v1, kind: Pod, namespace: default}\n"
    )
    # As alice (her commands grant allows it); her token goes in the
    # environment, never on a command line.
    alice_env = {**ctl_env, "TUNNELCTL_TOKEN": alice_token(ctl_env)}
    del alice_env["TUNNELCTL_TOKEN_FILE"]
    answer = shell(
        [
            str(BIN / "tunnelctl"),
            "run",
            "--cluster",
            "demo",
            "-f",
            str(command),
            "--follow",
            "-o",
            "json",
        ],
        alice_env,
        quiet=True,
    )
    # --follow prints the log lines, then the final command as JSON.
    outcome = json.loads(answer[answer.index("\n{") + 1 :])
    items = outcome["result"]["summary"]["result"]["items"]
    names = ", ".join(item["metadata"]["name"] for item in items)
    print(f"   {outcome['state']} (attempt {outcome['attempt']}): {len(items)} pods: {names}")

    section("8. The audit trail and the fleet")
    shell([str(BIN / "tunnelctl"), "audit", "--cluster", "demo", "--limit", "8"], ctl_env)
    shell([str(BIN / "tunnelctl"), "status"], ctl_env)
    console(server_url, state)
    print("\ndemo: OK: kubectl and a dispatched command both went through the tunnel.")
    if "--keep" in sys.argv[1:]:
        print("demo: --keep: the server, agent and cluster run on; Ctrl-C ends them.")
        with contextlib.suppress(KeyboardInterrupt):
            while all(service.process.poll() is None for service in processes):
                time.sleep(1.0)
    return 0


def console(server_url: str, state: Path) -> None:
    """Say where the web console is and how to sign in (and that it answers)."""
    section("9. The fleet console in a browser (served by tunnel-server itself)")
    address = f"{server_url}/ui/"
    context = ssl.create_default_context(cafile=str(state / "ca.crt"))
    try:
        with urllib.request.urlopen(f"{server_url}/ui/sign-in", context=context) as answer:
            status = answer.status
    except (OSError, urllib.error.URLError) as exc:
        raise DemoError(f"the console does not answer at {address}: {exc}") from exc
    print(f"   console: {address} (answers {status})")
    print(f"   sign in: paste the admin's API token, the one line of {state / 'admin-token'}")
    print(f"   (the browser trusts the server once it trusts its CA, {state / 'ca.crt'};")
    print("   run `bash scripts/demo --keep` to keep everything running while you look)")


def alice_token(env: dict[str, str]) -> str:
    """A fresh API token of alice's (the one she got at creation was printed once)."""
    answer = shell(
        [str(BIN / "tunnelctl"), "user", "token", "alice", "-o", "json"], env, quiet=True
    )
    token: str = json.loads(answer)["token"]
    return token


def section(title: str) -> None:
    print(f"\n== {title}")


def shell(args: Sequence[str], env: dict[str, str], *, quiet: bool = False) -> str:
    shown = shlex.join(Path(a).name if a.startswith(str(BIN)) else a for a in args)
    print(f"$ {shown}")
    result = subprocess.run(
        list(args), env=env, capture_output=True, text=True, timeout=STEP_TIMEOUT, cwd=ROOT
    )
    if not quiet:
        for line in result.stdout.splitlines():
            print(f"   {line}")
    if result.returncode != 0:
        raise DemoError(f"{shown} exited {result.returncode}: {result.stderr.strip()}")
    return result.stdout


def start(args: Sequence[str], env: dict[str, str], services: list[Service]) -> Service:
    process = subprocess.Popen(
        list(args),
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    service = Service(Path(args[0]).name if args[0] != sys.executable else args[2], process)
    services.append(service)
    return service


def wait_for_line(service: Service, marker: str) -> None:
    """Read the service's output until a line contains ``marker``."""
    deadline = time.monotonic() + STEP_TIMEOUT
    for line in lines(service, deadline):
        service.last_lines.append(line.rstrip())
        print(f"   | {line.rstrip()}")
        if marker in line:
            return
    raise DemoError(f"{service.name} did not say {marker!r} in time")


def lines(service: Service, deadline: float) -> Iterator[str]:
    process = service.process
    assert process.stdout is not None
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], 0.5)
        if ready:
            line = process.stdout.readline()
            if not line:
                return
            yield line
        elif process.poll() is not None:
            return


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def stop_all(services: list[Service]) -> None:
    for service in reversed(services):
        if service.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(service.process.pid, signal.SIGTERM)
    for service in reversed(services):
        try:
            service.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(service.process.pid, signal.SIGKILL)
            service.process.wait()


if __name__ == "__main__":
    sys.exit(main())
