"""The fake container processes: shell scripts, stdin handling, tar both ways."""

from __future__ import annotations

import asyncio
import io
import tarfile

import pytest

from tests.kubestub.commands import CommandNotFoundError, Process, Stdin, run_command
from tests.kubestub.podfs import FileSystem


async def _run(
    argv: list[str], files: FileSystem | None = None, stdin: bytes = b"", tty: bool = False
) -> tuple[int, bytes, bytes]:
    out: list[bytes] = []
    err: list[bytes] = []

    async def stdout(data: bytes) -> None:
        out.append(data)

    async def stderr(data: bytes) -> None:
        err.append(data)

    process = Process(
        argv,
        files or FileSystem("pod"),
        Stdin(data=stdin),
        stdout,
        stderr,
        {"HOSTNAME": "pod"},
        tty,
    )
    code = await run_command(process)
    return code, b"".join(out), b"".join(err)


async def test_sh_runs_sequences_conditionals_pipes_and_redirections() -> None:
    files = FileSystem("pod")
    script = "echo a > /tmp/f; echo b >> /tmp/f; cat /tmp/f | cat; false && echo no || echo yes"
    assert await _run(["sh", "-c", script], files) == (0, b"a\nb\nyes\n", b"")
    assert files.read("/tmp/f") == b"a\nb\n"
    assert await _run(["sh", "-c", "echo oops >&2; exit 7"]) == (7, b"", b"oops\n")
    assert await _run(["sh", "-c", "nosuch"]) == (127, b"", b"sh: nosuch: not found\n")


async def test_cat_copies_stdin_until_end_of_file() -> None:
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()
    for chunk in (b"one ", b"two", None):
        queue.put_nowait(chunk)
    out: list[bytes] = []

    async def collect(data: bytes) -> None:
        out.append(data)

    process = Process(["cat"], FileSystem(), Stdin(queue), collect, collect)
    assert await run_command(process) == 0
    assert b"".join(out) == b"one two"


async def test_interactive_shell_prompts_and_echoes_on_a_tty() -> None:
    code, out, _ = await _run(["sh"], stdin=b"echo hi\rexit 4\r", tty=True)
    assert code == 4
    assert out == b"/ # echo hi\nhi\n/ # exit 4\n"


async def test_tar_round_trips_a_directory() -> None:
    files = FileSystem("pod")
    files.mkdir("/data/sub")
    files.write("/data/a.txt", b"alpha")
    files.write("/data/sub/b.bin", bytes(range(256)))
    code, archive, _ = await _run(["tar", "cf", "-", "/data"], files)
    assert code == 0
    with tarfile.open(fileobj=io.BytesIO(archive)) as opened:
        assert sorted(opened.getnames()) == ["data", "data/a.txt", "data/sub", "data/sub/b.bin"]
    target = FileSystem("other")
    target.mkdir("/restore")
    code, _, err = await _run(["tar", "-xmf", "-", "-C", "/restore"], target, stdin=archive)
    assert (code, err) == (0, b"")
    assert target.read("/restore/data/sub/b.bin") == bytes(range(256))
    assert await _run(["test", "-d", "/restore/data"], target) == (0, b"", b"")
    assert (await _run(["test", "-d", "/restore/data/a.txt"], target))[0] == 1


async def test_ls_env_and_missing_files() -> None:
    files = FileSystem("pod")
    assert (await _run(["ls", "/"], files))[1] == b"etc\nroot\ntmp\nvar\n"
    assert (await _run(["env"]))[1] == b"HOSTNAME=pod\n"
    code, _, err = await _run(["cat", "/nope"])
    assert (code, err) == (1, b"cat: /nope: No such file or directory\n")


async def test_an_unknown_executable_is_not_found() -> None:
    with pytest.raises(CommandNotFoundError):
        await _run(["nosuch"])
