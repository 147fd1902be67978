"""The fake container processes ``kubectl exec`` and ``kubectl cp`` run.

A small busybox: ``echo``, ``cat``, ``true``/``false``, ``sh -c`` (with ``;``,
``&&``, ``||``, ``|``, ``>``, ``>>``, ``<`` and ``exit N``), an interactive
``sh``, ``env``/``printenv``, ``ls``, ``test``/``[``, ``mkdir``, ``rm``,
``touch``, ``hostname``, ``pwd``, ``whoami``, ``sleep`` and ``tar`` (create
and extract, enough for ``kubectl cp`` both ways) over the pod's in-memory
filesystem (:mod:`tests.kubestub.podfs`). ``cat`` without arguments copies
stdin to stdout until stdin closes, which is how tests prove half-close.
"""

from __future__ import annotations

import asyncio
import io
import posixpath
import shlex
import tarfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from tests.kubestub.podfs import FileSystem, FileSystemError

__all__ = ["CommandNotFoundError", "Process", "Stdin", "run_command"]

Writer = Callable[[bytes], Awaitable[None]]
_MAX_STDIN = 64 * 1024 * 1024
_MAX_SLEEP = 3600.0


class CommandNotFoundError(Exception):
    """The executable does not exist: the runtime fails the exec itself."""


class Stdin:
    """The process's standard input: chunks from the client until end of file."""

    def __init__(self, queue: asyncio.Queue[bytes | None] | None = None, data: bytes = b"") -> None:
        self._queue = queue
        self._buffer = data
        self._eof = queue is None

    async def read(self) -> bytes:
        """The next chunk, or ``b""`` at end of file."""
        if self._buffer:
            data, self._buffer = self._buffer, b""
            return data
        if self._eof or self._queue is None:
            return b""
        chunk = await self._queue.get()
        if chunk is None:
            self._eof = True
            return b""
        return chunk

    async def read_all(self) -> bytes:
        """Everything until end of file (bounded)."""
        parts = []
        total = 0
        while chunk := await self.read():
            total += len(chunk)
            if total > _MAX_STDIN:
                raise FileSystemError("File too large")
            parts.append(chunk)
        return b"".join(parts)

    def unread(self, data: bytes) -> None:
        """Push ``data`` back to be read first."""
        self._buffer = data + self._buffer


@dataclass
class Process:
    """One command to run, with its streams and the pod it runs in."""

    argv: list[str]
    files: FileSystem
    stdin: Stdin
    stdout: Writer
    stderr: Writer
    env: dict[str, str] = field(default_factory=dict)
    tty: bool = False
    cwd: str = "/"


async def run_command(process: Process) -> int:
    """Run ``process``; return its exit code. Raises :class:`CommandNotFoundError`."""
    if not process.argv:
        raise CommandNotFoundError("")
    name = posixpath.basename(process.argv[0])
    command = _COMMANDS.get(name)
    if command is None:
        raise CommandNotFoundError(process.argv[0])
    return await command(process, process.argv[1:])


async def _echo(p: Process, args: list[str]) -> int:
    newline = True
    if args[:1] == ["-n"]:
        newline, args = False, args[1:]
    await p.stdout((" ".join(args) + ("\n" if newline else "")).encode())
    return 0


async def _cat(p: Process, args: list[str]) -> int:
    if not args or args == ["-"]:
        while chunk := await p.stdin.read():
            await p.stdout(chunk)
        return 0
    status = 0
    for name in args:
        try:
            await p.stdout(p.files.read(p.files.normalize(name, p.cwd)))
        except FileSystemError as exc:
            await p.stderr(f"cat: {name}: {exc}\n".encode())
            status = 1
    return status


async def _true(p: Process, args: list[str]) -> int:
    return 0


async def _false(p: Process, args: list[str]) -> int:
    return 1


async def _env(p: Process, args: list[str]) -> int:
    if args:
        value = p.env.get(args[0])
        if value is None:
            return 1
        await p.stdout(f"{value}\n".encode())
        return 0
    await p.stdout("".join(f"{k}={v}\n" for k, v in p.env.items()).encode())
    return 0


async def _ls(p: Process, args: list[str]) -> int:
    flags = "".join(a[1:] for a in args if a.startswith("-"))
    paths = [a for a in args if not a.startswith("-")] or ["."]
    status = 0
    for path in paths:
        full = p.files.normalize(path, p.cwd)
        node = p.files.get(full)
        if node is None:
            await p.stderr(f"ls: cannot access '{path}': No such file or directory\n".encode())
            status = 2
            continue
        names = p.files.listdir(full) if node.is_dir else [path]
        if "a" in flags and node.is_dir:
            names = [".", "..", *names]
        if len(paths) > 1 and node.is_dir:
            await p.stdout(f"{path}:\n".encode())
        for name in names:
            if "l" in flags:
                child = p.files.get(posixpath.join(full, name)) if node.is_dir else node
                size = len(child.data or b"") if child else 0
                kind = "d" if child is None or child.is_dir else "-"
                await p.stdout(f"{kind}rw-r--r--    1 root     root {size:>12} {name}\n".encode())
            else:
                await p.stdout(f"{name}\n".encode())
    return status


async def _test(p: Process, args: list[str]) -> int:
    if args and args[-1] == "]" and p.argv[0] == "[":
        args = args[:-1]
    if len(args) == 2 and args[0] in ("-d", "-f", "-e", "-s"):
        node = p.files.get(p.files.normalize(args[1], p.cwd))
        ok = {
            "-d": node is not None and node.is_dir,
            "-f": node is not None and not node.is_dir,
            "-e": node is not None,
            "-s": node is not None and bool(node.data),
        }[args[0]]
        return 0 if ok else 1
    if len(args) == 2 and args[0] in ("-z", "-n"):
        return 0 if (args[1] == "") == (args[0] == "-z") else 1
    if len(args) == 3 and args[1] in ("=", "!="):
        return 0 if (args[0] == args[2]) == (args[1] == "=") else 1
    if len(args) == 1:
        return 0 if args[0] else 1
    return 2


async def _mkdir(p: Process, args: list[str]) -> int:
    parents = "-p" in args
    for path in (a for a in args if not a.startswith("-")):
        try:
            p.files.mkdir(p.files.normalize(path, p.cwd), parents=parents)
        except FileSystemError as exc:
            await p.stderr(f"mkdir: can't create directory '{path}': {exc}\n".encode())
            return 1
    return 0


async def _rm(p: Process, args: list[str]) -> int:
    flags = "".join(a[1:] for a in args if a.startswith("-"))
    for path in (a for a in args if not a.startswith("-")):
        try:
            p.files.remove(p.files.normalize(path, p.cwd), recursive="r" in flags.lower())
        except FileSystemError as exc:
            if "f" not in flags:
                await p.stderr(f"rm: can't remove '{path}': {exc}\n".encode())
                return 1
    return 0


async def _touch(p: Process, args: list[str]) -> int:
    for path in args:
        full = p.files.normalize(path, p.cwd)
        if not p.files.exists(full):
            try:
                p.files.write(full, b"")
            except FileSystemError as exc:
                await p.stderr(f"touch: {path}: {exc}\n".encode())
                return 1
    return 0


async def _hostname(p: Process, args: list[str]) -> int:
    await p.stdout(f"{p.env.get('HOSTNAME', '')}\n".encode())
    return 0


async def _pwd(p: Process, args: list[str]) -> int:
    await p.stdout(f"{p.cwd}\n".encode())
    return 0


async def _whoami(p: Process, args: list[str]) -> int:
    await p.stdout(b"root\n")
    return 0


async def _sleep(p: Process, args: list[str]) -> int:
    try:
        seconds = float(args[0]) if args else 0.0
    except ValueError:
        await p.stderr(f"sleep: invalid number '{args[0]}'\n".encode())
        return 1
    await asyncio.sleep(min(max(seconds, 0.0), _MAX_SLEEP))
    return 0


async def _tar(p: Process, args: list[str]) -> int:
    if not args:
        await p.stderr(b"tar: You must specify one of the '-Acdtrux' options\n")
        return 2
    letters = ""
    archive, directory, paths = "-", p.cwd, []
    expect = ""
    for index, arg in enumerate(args):
        if expect == "f":
            archive, expect = arg, ""
        elif expect == "C":
            directory, expect = p.files.normalize(arg, p.cwd), ""
        elif arg.startswith("--"):
            continue
        elif arg == "-C":
            expect = "C"
        elif (index == 0 and not arg.startswith("-")) or (arg.startswith("-") and len(arg) > 1):
            cluster = arg.lstrip("-")
            letters += cluster
            expect = "f" if "f" in cluster else ""
        else:
            paths.append(arg)
    if archive != "-":
        await p.stderr(b"tar: only '-' (stdin or stdout) is supported as the archive\n")
        return 2
    if "c" in letters:
        return await _tar_create(p, paths, directory)
    if "x" in letters:
        return await _tar_extract(p, directory)
    await p.stderr(b"tar: You must specify one of the '-Acdtrux' options\n")
    return 2


async def _tar_create(p: Process, paths: list[str], directory: str) -> int:
    buffer = io.BytesIO()
    status = 0
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for path in paths:
            full = p.files.normalize(path, directory)
            try:
                names = p.files.walk(full)
            except FileSystemError:
                await p.stderr(f"tar: {path}: Cannot stat: No such file or directory\n".encode())
                status = 2
                continue
            for name in names:
                node = p.files.get(name)
                assert node is not None
                info = tarfile.TarInfo(name.lstrip("/") + ("/" if node.is_dir else ""))
                info.mtime = int(node.mtime)
                info.mode = node.mode
                if node.is_dir:
                    info.type = tarfile.DIRTYPE
                    archive.addfile(info)
                else:
                    data = node.data or b""
                    info.size = len(data)
                    archive.addfile(info, io.BytesIO(data))
    await p.stdout(buffer.getvalue())
    return status


async def _tar_extract(p: Process, directory: str) -> int:
    data = await p.stdin.read_all()
    if not p.files.is_dir(directory):
        await p.stderr(f"tar: {directory}: Cannot open: No such file or directory\n".encode())
        return 2
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as archive:
            for member in archive.getmembers():
                name = p.files.normalize(member.name.lstrip("/"), directory)
                if member.isdir():
                    p.files.mkdir(name, mode=member.mode or 0o755)
                elif member.isfile():
                    p.files.mkdir(posixpath.dirname(name))
                    extracted = archive.extractfile(member)
                    content = extracted.read() if extracted else b""
                    p.files.write(name, content, mode=member.mode or 0o644, mtime=member.mtime)
    except tarfile.TarError as exc:
        await p.stderr(f"tar: {exc}\n".encode())
        return 2
    except FileSystemError as exc:
        await p.stderr(f"tar: {exc}\n".encode())
        return 2
    return 0


async def _sh(p: Process, args: list[str]) -> int:
    if args[:1] == ["-c"]:
        if len(args) < 2:
            await p.stderr(b"sh: -c requires an argument\n")
            return 2
        return await _script(p, args[1])
    return await _interactive(p)


class _Exit(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


async def _script(p: Process, script: str) -> int:
    """Run a shell script: a sequence of pipelines joined by ``;``, ``&&``, ``||``, newlines."""
    lexer = shlex.shlex(script.replace("\n", " ; "), posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError as exc:
        await p.stderr(f"sh: syntax error: {exc}\n".encode())
        return 2
    status = 0
    skip = False
    pipeline: list[str] = []
    try:
        for token in [*tokens, ";"]:
            if token in (";", "&&", "||"):
                if pipeline and not skip:
                    status = await _pipeline(p, pipeline)
                pipeline = []
                skip = (token == "&&" and status != 0) or (token == "||" and status == 0)
            else:
                pipeline.append(token)
    except _Exit as exit_:
        return exit_.code
    return status


async def _pipeline(p: Process, tokens: list[str]) -> int:
    stages: list[list[str]] = [[]]
    for token in tokens:
        if token == "|":
            stages.append([])
        else:
            stages[-1].append(token)
    feed: bytes | None = None
    status = 0
    for position, stage in enumerate(stages):
        last = position == len(stages) - 1
        captured: list[bytes] = []

        async def capture(data: bytes, _into: list[bytes] = captured) -> None:
            _into.append(data)

        stdin = p.stdin if feed is None else Stdin(data=feed)
        status = await _simple(p, stage, stdin, p.stdout if last else capture)
        feed = b"".join(captured)
    return status


async def _simple(p: Process, words: list[str], stdin: Stdin, stdout: Writer) -> int:
    argv: list[str] = []
    target: tuple[str, str] | None = None
    stderr = p.stderr
    index = 0
    while index < len(words):
        word = words[index]
        # shlex splits ">&2" into ">&", "2" and "2>&1" into "2", ">&", "1".
        if word == ">&" and words[index + 1 : index + 2] == ["2"]:
            stdout = p.stderr
            index += 2
            continue
        if word == "2" and words[index + 1 : index + 3] == [">&", "1"]:
            stderr = stdout
            index += 3
            continue
        if word in (">", ">>", "<") and index + 1 < len(words):
            path = p.files.normalize(words[index + 1], p.cwd)
            if word == "<":
                try:
                    stdin = Stdin(data=p.files.read(path))
                except FileSystemError as exc:
                    await p.stderr(f"sh: can't open '{words[index + 1]}': {exc}\n".encode())
                    return 1
            else:
                target = (word, path)
            index += 2
            continue
        argv.append(word)
        index += 1
    if not argv:
        return 0
    if argv[0] == "exit":
        raise _Exit(int(argv[1]) & 0xFF if len(argv) > 1 and argv[1].lstrip("-").isdigit() else 0)
    output: list[bytes] = []

    async def into_file(data: bytes) -> None:
        output.append(data)

    child = Process(
        argv, p.files, stdin, into_file if target else stdout, stderr, p.env, p.tty, p.cwd
    )
    try:
        status = await run_command(child)
    except CommandNotFoundError:
        await p.stderr(f"sh: {argv[0]}: not found\n".encode())
        return 127
    if target is not None:
        mode, path = target
        old = p.files.read(path) if mode == ">>" and p.files.exists(path) else b""
        try:
            p.files.write(path, old + b"".join(output))
        except FileSystemError as exc:
            await p.stderr(f"sh: can't create {path}: {exc}\n".encode())
            return 1
    return status


async def _interactive(p: Process) -> int:
    """A shell reading commands from stdin; with a TTY it prompts and echoes like a terminal."""
    prompt = b"/ # " if p.tty else b""
    await p.stdout(prompt)
    line = b""
    status = 0
    while chunk := await p.stdin.read():
        for byte in chunk:
            char = bytes([byte])
            if char in (b"\r", b"\n"):
                if p.tty:
                    await p.stdout(b"\n")
                try:
                    status = await _script(p, line.decode("utf-8", "replace"))
                except _Exit as exit_:
                    return exit_.code
                if line.strip() == b"exit" or line.strip().startswith(b"exit "):
                    return status
                line = b""
                await p.stdout(prompt)
            elif char == b"\x04" and not line:
                return status
            elif char == b"\x7f":
                if line:
                    line = line[:-1]
                    if p.tty:
                        await p.stdout(b"\b \b")
            else:
                line += char
                if p.tty:
                    await p.stdout(char)
    if line.strip():
        status = await _script(p, line.decode("utf-8", "replace"))
    return status


_COMMANDS: dict[str, Callable[[Process, list[str]], Awaitable[int]]] = {
    "echo": _echo,
    "cat": _cat,
    "true": _true,
    "false": _false,
    "env": _env,
    "printenv": _env,
    "ls": _ls,
    "test": _test,
    "[": _test,
    "mkdir": _mkdir,
    "rm": _rm,
    "touch": _touch,
    "hostname": _hostname,
    "pwd": _pwd,
    "whoami": _whoami,
    "sleep": _sleep,
    "tar": _tar,
    "sh": _sh,
    "bash": _sh,
    "ash": _sh,
}
