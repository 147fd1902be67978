"""kubectl's streaming commands: get -w, logs -f, exec, cp, attach, port-forward."""

from __future__ import annotations

import asyncio
import re

from tests.kubestub import KubeStub
from tests.support import until

from .kubectl import TIMEOUT, Kubectl


async def test_get_watch_prints_a_pod_added_after_it_started(
    kubectl: Kubectl, stub: KubeStub
) -> None:
    watching = await kubectl.start("get", "pods", "-w")
    try:
        assert (await watching.line()).split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
        assert (await watching.line()).split()[:3] == ["demo", "1/1", "Running"]
        await asyncio.wait_for(
            stub.requests.wait_for(lambda entry: "watch=true" in entry.query_string), TIMEOUT
        )
        await until(lambda: stub.store.watcher_count > 0)
        stub.add_pod("late")
        assert (await watching.line()).split()[:3] == ["late", "1/1", "Running"]
        result = await kubectl.run("delete", "pod", "late")
        assert result.returncode == 0
        assert (await watching.line()).split()[:3] == ["late", "1/1", "Terminating"]
    finally:
        stderr = await watching.stop()
    assert stderr == ""
    watch = next(e for e in stub.requests if "watch=true" in e.query_string)
    assert "resourceVersion=" in watch.query_string


async def test_logs_follow_prints_lines_as_they_are_appended(
    kubectl: Kubectl, stub: KubeStub
) -> None:
    stub.append_log("default", "demo", "first line")
    following = await kubectl.start("logs", "-f", "demo")
    try:
        assert await following.line() == "first line"
        stub.append_log("default", "demo", "second line")
        assert await following.line() == "second line"
        stub.append_log("default", "demo", "third\nfourth")
        assert [await following.line(), await following.line()] == ["third", "fourth"]
        stub.close_log("default", "demo")
        assert await asyncio.wait_for(following.process.wait(), TIMEOUT) == 0
    finally:
        stderr = await following.stop()
    assert stderr == ""


async def test_logs_tail_and_timestamps(kubectl: Kubectl, stub: KubeStub) -> None:
    for number in range(5):
        stub.append_log("default", "demo", f"line {number}")
    tail = await kubectl.run("logs", "demo", "--tail=2")
    assert tail.stdout == "line 3\nline 4\n"
    stamped = await kubectl.run("logs", "demo", "--tail=1", "--timestamps")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z line 4\n", stamped.stdout)


async def test_exec_echo_prints_its_output(kubectl: Kubectl, stub: KubeStub) -> None:
    result = await kubectl.run("exec", "demo", "--", "echo", "hi")
    assert (result.returncode, result.stdout, result.stderr) == (0, "hi\n", "")
    upgrade = next(e for e in stub.requests if e.path.endswith("/exec"))
    assert upgrade.status == 101
    assert upgrade.header("Sec-WebSocket-Protocol") == "v5.channel.k8s.io"


async def test_exec_cat_echoes_stdin_until_stdin_closes(kubectl: Kubectl) -> None:
    data = b"".join(b"line %d\n" % n for n in range(2000))
    result = await kubectl.run("exec", "-i", "demo", "--", "cat", stdin=data)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.encode() == data


async def test_exec_exit_code_is_kubectls_exit_code(kubectl: Kubectl) -> None:
    result = await kubectl.run("exec", "demo", "--", "sh", "-c", "echo out; echo err >&2; exit 3")
    assert result.returncode == 3
    assert result.stdout == "out\n"
    assert result.stderr == "err\ncommand terminated with exit code 3\n"


async def test_exec_of_a_missing_command_fails_like_the_runtime(kubectl: Kubectl) -> None:
    result = await kubectl.run("exec", "demo", "--", "nosuch")
    assert result.returncode == 1
    assert 'exec: "nosuch": executable file not found in $PATH' in result.stderr


async def test_attach_runs_the_containers_process(kubectl: Kubectl, stub: KubeStub) -> None:
    result = await kubectl.run("attach", "-i", "demo", stdin=b"echo attached\nexit 0\n")
    assert result.returncode == 0, result.stderr
    assert "attached\n" in result.stdout


async def test_cp_copies_a_directory_into_a_pod_and_back(kubectl: Kubectl, stub: KubeStub) -> None:
    source = kubectl.workdir / "src"
    (source / "sub").mkdir(parents=True)
    (source / "a.txt").write_text("hello\n")
    (source / "sub" / "b.bin").write_bytes(bytes(range(256)) * 64)
    upload = await kubectl.run("cp", "src", "demo:/tmp/up")
    assert (upload.returncode, upload.stderr) == (0, "")
    files = stub.pod_files("default", "demo")
    assert files.read("/tmp/up/a.txt") == b"hello\n"
    assert files.read("/tmp/up/sub/b.bin") == bytes(range(256)) * 64
    download = await kubectl.run("cp", "demo:/tmp/up", "back")
    assert (download.returncode, download.stderr) == (0, "")
    assert (kubectl.workdir / "back" / "a.txt").read_text() == "hello\n"
    assert (kubectl.workdir / "back" / "sub" / "b.bin").read_bytes() == bytes(range(256)) * 64


async def test_port_forward_carries_bytes_to_the_pod_port(kubectl: Kubectl, stub: KubeStub) -> None:
    forwarding = await kubectl.start("port-forward", "pod/demo", ":8080")
    try:
        match = re.match(r"Forwarding from 127\.0\.0\.1:(\d+) -> 8080", await forwarding.line())
        assert match, "kubectl did not say where it listens"
        port = int(match.group(1))

        async def round_trip(payload: bytes) -> bytes:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(payload)
            writer.write_eof()
            echoed = await asyncio.wait_for(reader.read(), TIMEOUT)
            writer.close()
            await writer.wait_closed()
            return echoed

        assert await round_trip(b"hello over SPDY") == b"hello over SPDY"
        # Concurrent connections share the one SPDY session, each with its own streams.
        payloads = [bytes([n]) * 100_000 for n in range(4)]
        assert await asyncio.gather(*map(round_trip, payloads)) == payloads
    finally:
        stderr = await forwarding.stop()
    assert stderr == ""
    upgrade = next(e for e in stub.requests if e.path.endswith("/portforward"))
    assert upgrade.header("Sec-WebSocket-Protocol") == "SPDY/3.1+portforward.k8s.io"
    assert upgrade.status == 101


async def test_port_forward_to_a_closed_port_reports_the_error(
    kubectl: Kubectl, stub: KubeStub
) -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    stub.set_port_target("default", "demo", 9999, "127.0.0.1", port)
    forwarding = await kubectl.start("port-forward", "pod/demo", ":9999")
    try:
        match = re.match(r"Forwarding from 127\.0\.0\.1:(\d+)", await forwarding.line())
        assert match
        reader, writer = await asyncio.open_connection("127.0.0.1", int(match.group(1)))
        assert await asyncio.wait_for(reader.read(), TIMEOUT) == b""
        writer.close()
        await writer.wait_closed()
        await asyncio.wait_for(forwarding.process.wait(), TIMEOUT)
    finally:
        stderr = await forwarding.stop()
    assert "error forwarding port 9999 to pod demo" in stderr
    assert "connection refused" in stderr.lower()
