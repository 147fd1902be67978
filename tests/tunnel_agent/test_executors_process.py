"""Subprocesses (tunnel_agent.executors.process) and masking (tunnel_agent.executors.masking)."""

from __future__ import annotations

import asyncio
import base64
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakebin import wait_gone
from tunnel_agent.executors.context import MAX_LINE, ExecutionContext
from tunnel_agent.executors.errors import ProcessError
from tunnel_agent.executors.masking import Masker
from tunnel_agent.executors.process import (
    MARK_VARIABLE,
    ProcessResult,
    find_binary,
    kill_marked,
    run_process,
)


async def _run(tmp_path: Path, code: str, **options: object) -> tuple[ProcessResult, list[str]]:
    lines: list[str] = []
    result = await run_process(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        environment={"PATH": "/usr/bin:/bin"},
        emit=lines.append,
        kill_grace=1.0,
        **options,  # type: ignore[arg-type]
    )
    return result, lines


async def test_stdout_and_stderr_lines_are_emitted_and_the_exit_status_kept(tmp_path: Path) -> None:
    code = "import sys; print('one'); print('two', file=sys.stderr); sys.exit(3)"
    result, lines = await _run(tmp_path, code)
    assert result.returncode == 3
    assert sorted(lines) == ["one", "two"]
    assert result.last_error == "two"


async def test_captured_stdout_is_returned_and_not_emitted(tmp_path: Path) -> None:
    code = "import sys; print('{\"a\": 1}'); print('note', file=sys.stderr)"
    result, lines = await _run(tmp_path, code, capture_stdout=True)
    assert result.stdout == b'{"a": 1}\n'
    assert lines == ["note"]


async def test_captured_stdout_over_its_limit_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ProcessError, match="wrote more than 10 bytes of output"):
        await _run(tmp_path, "print('x' * 100)", capture_stdout=True, stdout_limit=10)


async def test_an_endless_line_is_cut_and_the_next_line_still_comes(tmp_path: Path) -> None:
    code = "import sys; sys.stdout.write('x' * 200000 + '\\nafter\\n')"
    _, lines = await _run(tmp_path, code)
    assert len(lines) == 2
    assert lines[0].endswith(" ...[truncated]")
    assert lines[1] == "after"


async def test_a_background_child_left_behind_does_not_hold_the_run(tmp_path: Path) -> None:
    code = (
        "import subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)'])\n"
        "print('parent done')\n"
    )
    result, lines = await _run(tmp_path, code)
    assert (result.returncode, lines) == (0, ["parent done"])


_ESCAPE = (
    "import os, subprocess, sys\n"
    # A child in a session of its own: outside the process group the agent kills.
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)'],"
    " start_new_session=True)\n"
    "open(sys.argv[1], 'w').write(str(child.pid))\n"
    "print('parent done', flush=True)\n"
)


async def test_a_child_that_left_the_process_group_is_stopped_with_the_run(
    tmp_path: Path,
) -> None:
    pid_file = tmp_path / "escapee.pid"
    lines: list[str] = []
    result = await run_process(
        [sys.executable, "-c", _ESCAPE, str(pid_file)],
        cwd=tmp_path,
        environment={"PATH": "/usr/bin:/bin"},
        emit=lines.append,
        kill_grace=1.0,
    )
    assert result.returncode == 0
    assert await wait_gone(int(pid_file.read_text()))
    assert lines[-1] == (
        f"[agent] stopped 1 process that {Path(sys.executable).name} left running"
        " outside its process group"
    )


async def test_a_cancelled_run_stops_the_child_that_left_its_group_too(tmp_path: Path) -> None:
    pid_file = tmp_path / "escapee.pid"
    code = _ESCAPE + "import time; time.sleep(3600)\n"
    lines: list[str] = []
    started = asyncio.Event()

    def emit(line: str) -> None:
        lines.append(line)
        if line == "parent done":
            started.set()

    run = asyncio.create_task(
        run_process(
            [sys.executable, "-c", code, str(pid_file)],
            cwd=tmp_path,
            environment={"PATH": "/usr/bin:/bin"},
            emit=emit,
            kill_grace=1.0,
        )
    )
    await asyncio.wait_for(started.wait(), 30)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert await wait_gone(int(pid_file.read_text()))
    assert "outside its process group" in lines[-1]


def test_only_processes_with_the_mark_are_stopped() -> None:
    # Each says "ready" once it runs its own program (before, /proc shows its parent's environment).
    sleep = [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(3600)"]
    environment = {"PATH": "/usr/bin:/bin"}
    marked, other = (
        subprocess.Popen(sleep, env=environment | {MARK_VARIABLE: mark}, stdout=subprocess.PIPE)
        for mark in ("abc123", "abc1234")
    )
    try:
        for process in (marked, other):
            assert process.stdout is not None
            assert process.stdout.readline() == b"ready\n"
        assert kill_marked("abc123") == 1
        assert marked.wait(timeout=30) == -signal.SIGKILL
        assert other.poll() is None
        assert kill_marked("abc123") == 0
    finally:
        for process in (marked, other):
            process.kill()
            process.wait()
            assert process.stdout is not None
            process.stdout.close()


def test_a_member_of_the_runs_group_still_dying_is_stopped_but_not_told_as_escaped() -> None:
    """Found in CI: a child killed with its group, not gone yet, was told as an escapee."""
    sleep = [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(3600)"]
    member = subprocess.Popen(
        sleep,
        env={"PATH": "/usr/bin:/bin", MARK_VARIABLE: "run42"},
        stdout=subprocess.PIPE,
        start_new_session=True,  # leads a group of its own: the run's, here
    )
    try:
        assert member.stdout is not None
        assert member.stdout.readline() == b"ready\n"
        assert kill_marked("run42", group=member.pid) == 0
        assert member.wait(timeout=30) == -signal.SIGKILL
    finally:
        member.kill()
        member.wait()
        assert member.stdout is not None
        member.stdout.close()


def test_without_proc_no_process_is_found(tmp_path: Path) -> None:
    assert kill_marked("abc", proc=tmp_path / "no-proc") == 0


async def test_a_binary_that_cannot_start_is_a_process_error(tmp_path: Path) -> None:
    script = tmp_path / "tool"
    script.write_text("not executable")
    with pytest.raises(ProcessError, match="cannot start tool: Permission denied"):
        await run_process([str(script)], cwd=tmp_path, environment={}, emit=print, kill_grace=1.0)


def test_find_binary_takes_the_first_name_on_the_path(tmp_path: Path) -> None:
    for name in ("terraform", "tofu"):
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    assert find_binary(["tofu", "terraform"], {"PATH": str(tmp_path)}) == str(tmp_path / "tofu")
    (tmp_path / "tofu").unlink()
    assert find_binary(["tofu", "terraform"], {"PATH": str(tmp_path)}) == str(
        tmp_path / "terraform"
    )
    with pytest.raises(ProcessError, match="helm is not on the agent's PATH"):
        find_binary(["helm"], {"PATH": str(tmp_path)})


def test_the_error_line_is_the_last_error_even_inside_a_diagnostic_frame() -> None:
    tail = (
        "\u2577",
        "\u2502 Error: No value for required variable",
        "\u2502 this variable.",
        "\u2575",
    )
    assert ProcessResult(1, b"", tail).last_error == "Error: No value for required variable"
    assert ProcessResult(1, b"", ("a", "b", "")).last_error == "b"


def test_the_masker_hides_values_and_their_common_forms() -> None:
    masker = Masker()
    masker.add("hunter2")
    masker.add('pa"ss')
    encoded = base64.b64encode(b"hunter2").decode()
    assert masker.mask(f"password=hunter2 data={encoded}") == "password=*** data=***"
    assert masker.mask('{"p": "pa\\"ss"}') == '{"p": "***"}'


def test_the_masker_hides_each_line_of_a_multi_line_value() -> None:
    masker = Masker()
    masker.add("-----BEGIN KEY-----\nMIIEabcdef\n-----END KEY-----\n")
    assert masker.mask("  MIIEabcdef") == "  ***"


def test_the_masker_masks_the_longest_value_first() -> None:
    masker = Masker()
    masker.add("abc")
    masker.add("abcdef")
    assert masker.mask("xabcdefx abc") == "x***x ***"


def test_the_masker_ignores_blank_values() -> None:
    masker = Masker()
    masker.add("  ")
    masker.add("")
    assert len(masker) == 0
    assert masker.mask("a  b") == "a  b"


def test_emit_masks_then_caps_each_line(tmp_path: Path) -> None:
    lines: list[str] = []
    context = ExecutionContext("c", 1, kube=None, workdir=tmp_path, log=lines.append)  # type: ignore[arg-type]
    context.masker.add("hunter2")
    context.emit("password hunter2\n")
    context.emit("y" * (MAX_LINE * 2))
    assert lines[0] == "password ***"
    assert len(lines[1]) == MAX_LINE
    assert lines[1].endswith(" ...[truncated]")
