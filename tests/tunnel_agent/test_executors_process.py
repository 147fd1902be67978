"""Subprocesses (tunnel_agent.executors.process) and masking (tunnel_agent.executors.masking)."""

from __future__ import annotations

import base64
import sys
from pathlib import Path

import pytest

from tunnel_agent.executors.context import MAX_LINE, ExecutionContext
from tunnel_agent.executors.errors import ProcessError
from tunnel_agent.executors.masking import Masker
from tunnel_agent.executors.process import ProcessResult, find_binary, run_process


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
