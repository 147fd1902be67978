"""Taking access away ends the kubectl requests already in progress.

A watch, an exec session or a port-forward can last for days; the server
checked its caller once, when it opened. These tests run the real kubectl
through the real server and agent (the ``tunnel`` fixture of
test_kubectl_tunnel.py) and check that a revocation through the API ends the
requests it no longer allows, promptly, at the cluster too, and no others.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.kubestub_tests.kubectl import TIMEOUT, Kubectl, Running

from ..integration.test_observability import server_metrics
from ..support import until
from . import test_kubectl_tunnel as kubectl_e2e
from .test_kubectl_tunnel import Tunnel

server = kubectl_e2e.server
tunnel = kubectl_e2e.tunnel


async def watching(kubectl: Kubectl, tunnel: Tunnel, watchers: int = 1) -> Running:
    """``kubectl get pods -w``, once its watch is open at the API server and answering.

    ``watchers``: how many watches are open with this one.
    """
    watch = await kubectl.start("get", "pods", "-w", "--no-headers")
    assert (await watch.line()).split()[0] == "demo"
    # The first line comes from kubectl's LIST; its WATCH follows. Its answer's
    # head has reached the server when the request in progress has a status.
    live = tunnel.server.context.live

    def answering() -> int:
        return sum(1 for e in live.requests() if e.verb == "watch" and e.status == 200)

    await until(lambda: answering() >= watchers, max_turns=10**7)
    return watch


async def ended(running: Running) -> tuple[int, str]:
    """kubectl's exit status and stderr, once it ends on its own (it must, in time)."""
    code = await asyncio.wait_for(running.process.wait(), TIMEOUT)
    return code, await running.stop()


async def kubectl_for(tunnel: Tunnel, user: str, directory: Path) -> Kubectl:
    """kubectl for another user, granted prod-eu."""
    status, _ = await tunnel.server.api("POST", "/api/v1/users", {"name": user})
    assert status == 201
    status, _ = await tunnel.server.api("PUT", f"/api/v1/grants/{user}/prod-eu", {})
    assert status == 200
    status, answer = await tunnel.server.api(
        "POST", f"/api/v1/users/{user}/kubeconfig?cluster=prod-eu"
    )
    assert status == 201
    # The test server's public URL names no real port; point kubectl at it.
    return kubectl_with(
        answer["kubeconfig"].replace("https://127.0.0.1:1", tunnel.server.url), directory
    )


def kubectl_with(kubeconfig: str, directory: Path) -> Kubectl:
    directory.mkdir()
    (directory / "kc.yaml").write_text(kubeconfig)
    return Kubectl(directory / "kc.yaml", directory, directory)


async def test_ungrant_ends_a_watch_in_progress_at_the_caller_and_at_the_cluster(
    tunnel: Tunnel, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tunnel_agent.kubeproxy")
    watch = await watching(tunnel.kubectl, tunnel)

    status, answer = await tunnel.server.api("DELETE", "/api/v1/grants/alice/prod-eu")

    assert status == 200
    assert answer["ended_requests"] == 1
    # The watch's last event is the API server's way to end one with an error:
    # kubectl prints the Status, then ends as it does when a watch ends.
    assert (await watch.line()).split(maxsplit=2) == [
        "Failure",
        "Forbidden",
        "access revoked: user alice no longer has a grant on cluster prod-eu",
    ]
    await ended(watch)
    await until(lambda: tunnel.stub.store.watcher_count == 0, max_turns=10**7)
    # The agent's log tells the cluster's owner what ended, and why.
    assert "the server ended GET /api/v1/namespaces/default/pods?resourceVersion=" in caplog.text
    assert "user alice no longer has a grant on cluster prod-eu" in caplog.text
    again = await tunnel.kubectl.run("get", "pods")
    assert again.returncode != 0
    assert "no grant on cluster prod-eu" in again.stderr


async def last_audited(tunnel: Tunnel, verb: str) -> dict[str, Any]:
    """alice's last proxied request with ``verb`` in the audit trail, once none is in progress."""
    live = tunnel.server.context.live
    await until(lambda: not any(live.requests()), max_turns=10**7)
    status, events = await tunnel.server.api("GET", "/api/v1/audit?kind=proxy&user=alice")
    assert status == 200
    return next(event for event in events if event["verb"] == verb)


async def test_the_audit_says_access_revoked_ended_the_watch(tunnel: Tunnel) -> None:
    watch = await watching(tunnel.kubectl, tunnel)

    status, _ = await tunnel.server.api("DELETE", "/api/v1/grants/alice/prod-eu")

    assert status == 200
    await ended(watch)
    event = await last_audited(tunnel, "watch")
    # 200 is what kubectl was answered; the detail says what ended it.
    assert (event["status"], event["detail"]["ended"]) == (
        200,
        "access revoked: user alice no longer has a grant on cluster prod-eu",
    )
    table = await tunnelctl(tunnel, "audit", "--user", "alice", "--kind", "proxy")
    [heading, *rows] = table.splitlines()
    assert heading.split()[-1] == "DETAIL"
    [watch_row] = [row for row in rows if " watch " in row]
    assert watch_row.endswith(
        " ended=access revoked: user alice no longer has a grant on cluster prod-eu"
    )


async def test_the_audit_says_access_revoked_ended_the_exec_session(tunnel: Tunnel) -> None:
    session = await tunnel.kubectl.start("exec", "-i", "demo", "--", "cat", stdin=True)
    assert session.process.stdin is not None
    session.process.stdin.write(b"still here\n")
    assert await session.line() == "still here"

    status, _ = await tunnel.server.api("DELETE", "/api/v1/users/alice/tokens")

    assert status == 200
    await ended(session)
    event = await last_audited(tunnel, "exec")
    assert event["status"] == 101
    assert event["detail"]["ended"].startswith("access revoked: ")


async def test_revoking_a_users_tokens_ends_its_exec_session(tunnel: Tunnel) -> None:
    session = await tunnel.kubectl.start("exec", "-i", "demo", "--", "cat", stdin=True)
    assert session.process.stdin is not None
    session.process.stdin.write(b"still here\n")
    assert await session.line() == "still here"  # the session is open end to end

    status, answer = await tunnel.server.api("DELETE", "/api/v1/users/alice/tokens")

    assert status == 200
    assert answer["ended_requests"] == 1
    code, stderr = await ended(session)
    assert code != 0
    # Told why in the WebSocket's close frame, not cut off ("close 1006 ... unexpected EOF").
    assert "close 1008 (policy violation): access revoked: the caller's API token" in stderr


async def test_a_changed_grant_ends_the_port_forward_opened_under_the_old_identity(
    tunnel: Tunnel,
) -> None:
    forwarding = await tunnel.kubectl.start("port-forward", "pod/demo", ":8080")
    match = re.match(r"Forwarding from 127\.0\.0\.1:(\d+) -> 8080", await forwarding.line())
    assert match, "kubectl did not say where it listens"
    reader, writer = await asyncio.open_connection("127.0.0.1", int(match.group(1)))
    try:
        writer.write(b"ping")
        assert await asyncio.wait_for(reader.readexactly(4), TIMEOUT) == b"ping"

        # The cluster authorized the forward as tunnel:alice in tunnel:platform;
        # from now on she is also in tunnel:view-only, so it was not this identity.
        status, answer = await tunnel.server.api(
            "PUT", "/api/v1/grants/alice/prod-eu", {"as_groups": ["view-only"]}
        )

        assert status == 200
        assert answer["ended_requests"] == 1
        assert await asyncio.wait_for(reader.read(), TIMEOUT) == b""  # the forward ended
    finally:
        writer.close()
        await forwarding.stop()


async def test_only_the_revoked_users_requests_end(tunnel: Tunnel, tmp_path: Path) -> None:
    bob = await kubectl_for(tunnel, "bob", tmp_path / "bob")
    alices = await watching(tunnel.kubectl, tunnel, watchers=1)
    bobs = await watching(bob, tunnel, watchers=2)

    status, answer = await tunnel.server.api("DELETE", "/api/v1/grants/alice/prod-eu")

    assert (status, answer["ended_requests"]) == (200, 1)
    assert "access revoked" in await alices.line()
    await ended(alices)
    try:
        tunnel.stub.add_pod("arrived-later")
        assert (await bobs.line()).split()[0] == "arrived-later"  # bob's watch goes on
    finally:
        await bobs.stop()


async def test_a_request_that_ended_is_no_longer_held(tunnel: Tunnel) -> None:
    live = tunnel.server.context.live
    result = await tunnel.kubectl.run("get", "pod", "demo", "-o", "name")
    assert result.stdout.strip() == "pod/demo"
    assert len(live) == 0
    watch = await watching(tunnel.kubectl, tunnel)
    assert len(live) == 1
    await watch.stop()
    await until(lambda: len(live) == 0, max_turns=10**7)


async def test_the_metrics_count_requests_in_progress_and_those_revoked(tunnel: Tunnel) -> None:
    in_progress = ("tunnel_server_proxy_requests_in_progress", ())
    revoked = ("tunnel_server_proxy_requests_revoked_total", ())
    watch = await watching(tunnel.kubectl, tunnel)
    try:
        before = await server_metrics(tunnel.server)
        await tunnel.server.api("DELETE", "/api/v1/grants/alice/prod-eu")
        after = await server_metrics(tunnel.server)
    finally:
        await watch.stop()
    assert (before[in_progress], before[revoked]) == (1.0, 0.0)
    assert (after[in_progress], after[revoked]) == (0.0, 1.0)


async def tunnelctl(tunnel: Tunnel, *args: str) -> str:
    """Run the real tunnelctl as the server's admin; its stdout (it must succeed)."""
    return (await tunnelctl_both(tunnel, *args))[0]


async def tunnelctl_both(tunnel: Tunnel, *args: str) -> tuple[str, str]:
    """Run the real tunnelctl as the server's admin; its stdout and stderr (it must succeed)."""
    code, stdout, stderr = await tunnelctl_run(tunnel, *args)
    assert code == 0, stderr
    return stdout, stderr


async def tunnelctl_run(tunnel: Tunnel, *args: str) -> tuple[int, str, str]:
    """Run the real tunnelctl as the server's admin; its exit status, stdout and stderr."""
    ca = tunnel.settings_dir / "server-ca.crt"
    ca.write_bytes(tunnel.server.ca_pem)
    server = ["--server", tunnel.server.url, "--ca", str(ca)]
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "tunnelctl"),
        *server,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        # Not --token, which ps would show and tunnelctl would warn of on stderr.
        env={**os.environ, "TUNNELCTL_TOKEN": tunnel.server.admin_token},
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), TIMEOUT)
    assert process.returncode is not None
    return process.returncode, stdout.decode(), stderr.decode()


async def test_tunnelctl_says_how_many_requests_in_progress_a_revocation_ended(
    tunnel: Tunnel,
) -> None:
    watch = await watching(tunnel.kubectl, tunnel)
    try:
        ungranted = await tunnelctl(tunnel, "ungrant", "alice", "--cluster", "prod-eu")
        assert ungranted == (
            "alice no longer reaches prod-eu; ended 1 kubectl request(s) in progress\n"
        )
    finally:
        await watch.stop()
    # Nothing left to end: the line says only what was done.
    revoked = await tunnelctl(tunnel, "user", "revoke-tokens", "alice")
    assert revoked == "revoked 2 API token(s) of alice\n"  # the first, and the kubeconfig's


async def test_the_requests_in_progress_are_listed_with_who_what_and_how_much(
    tunnel: Tunnel,
) -> None:
    watch = await watching(tunnel.kubectl, tunnel)
    session = await tunnel.kubectl.start("exec", "-i", "demo", "--", "cat", stdin=True)
    try:
        assert session.process.stdin is not None
        session.process.stdin.write(b"twelve bytes")
        session.process.stdin.write(b"\n")
        assert await session.line() == "twelve bytes"

        status, listed = await tunnel.server.api("GET", "/api/v1/requests?cluster=prod-eu")

        assert status == 200
        assert [(r["user"], r["cluster"], r["verb"]) for r in listed] == [
            ("alice", "prod-eu", "watch"),  # the oldest first
            ("alice", "prod-eu", "exec"),
        ]
        watching_, executing = listed
        assert watching_["path"] == "/api/v1/namespaces/default/pods"
        assert executing["path"] == "/api/v1/namespaces/default/pods/demo/exec"
        assert executing["bytes_in"] > 13  # the WebSocket frames around what was typed
        assert executing["bytes_out"] > 13
        assert watching_["seconds"] >= executing["seconds"] >= 0
        assert datetime.fromisoformat(watching_["started"]).tzinfo is not None
        # Filters, and what tunnelctl shows of them.
        assert (await tunnel.server.api("GET", "/api/v1/requests?user=bob"))[1] == []
        table = (await tunnelctl(tunnel, "requests", "--user", "alice")).splitlines()
        assert table[0].split() == [
            "STARTED", "USER", "CLUSTER", "VERB", "PATH", "SECONDS", "IN", "OUT"
        ]  # fmt: skip
        assert [row.split()[1:4] for row in table[1:]] == [
            ["alice", "prod-eu", "watch"],
            ["alice", "prod-eu", "exec"],
        ]
    finally:
        await session.stop()
        await watch.stop()


async def test_only_an_admin_lists_the_requests_in_progress(tunnel: Tunnel) -> None:
    status, answer = await tunnel.server.api("GET", "/api/v1/requests", token=tunnel.alice_token)
    assert status == 403
    assert "admin" in answer["error"]["message"]


async def test_a_grant_change_that_keeps_the_identity_ends_nothing(tunnel: Tunnel) -> None:
    watch = await watching(tunnel.kubectl, tunnel)
    try:
        # The right to dispatch commands: the cluster sees alice as before.
        status, answer = await tunnel.server.api(
            "PUT", "/api/v1/grants/alice/prod-eu", {"commands": True}
        )
        assert (status, answer["ended_requests"]) == (200, 0)
        tunnel.stub.add_pod("arrived-later")
        assert (await watch.line()).split()[0] == "arrived-later"
    finally:
        await watch.stop()


async def test_a_new_token_that_revokes_the_others_ends_their_requests(tunnel: Tunnel) -> None:
    watch = await watching(tunnel.kubectl, tunnel)
    try:
        status, answer = await tunnel.server.api(
            "POST", "/api/v1/users/alice/tokens?revoke_others=1"
        )
        assert (status, answer["ended_requests"]) == (201, 1)
        assert "access revoked" in await watch.line()
    finally:
        await watch.stop()
