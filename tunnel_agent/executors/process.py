"""Running helm, tofu and git: own process group, lines logged as produced, killed on cancel.

Each process starts in a new session (so a new process group): stopping it
reaches everything it started. When the run is cancelled or times out, the
group gets SIGTERM, then SIGKILL after the grace period, and the
cancellation goes on. When the process exits by itself, anything it left
running in its group is killed, so no stray child holds the pipes open.

A descendant can leave the group (``setsid``, a daemon's double fork). Each
process gets a mark in its environment (:data:`MARK_VARIABLE`, one value per
call), which its descendants inherit; when it ends, every process still
carrying the mark is found in ``/proc`` and killed, and the run's log says
so. A process that scrubs its own environment is not found: this ends what a
tool leaves behind by accident, it does not confine code that hides
(docs/security.md, "Commands").

Standard output and error are read line by line as they come and sent to
the run's log (masked, capped); standard output can instead be captured
whole, unlogged, for output that holds values (``tofu output -json``).
Secrets are never passed as arguments: callers put them in the environment
or in a private file.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import socket
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import ProcessError

__all__ = ["MARK_VARIABLE", "ProcessResult", "find_binary", "kill_marked", "run_process"]

_CHUNK = 65536
#: A line longer than this (before masking) is cut; the rest up to its end is dropped.
_MAX_RAW_LINE = 65536
_TAIL_LINES = 40
#: Seconds to read what is left in the pipes once the process has ended.
_DRAIN = 5.0
_ERROR_PREFIXES = ("error", "fatal:")
#: The environment variable that marks every process one call started, and their descendants.
MARK_VARIABLE = "TUNNEL_AGENT_PROCESS"
#: Scans of /proc for marked processes, while each finds some (one forking as it is killed).
_MAX_SCANS = 20


@dataclass(frozen=True, slots=True)
class ProcessResult:
    """How a process ended: its exit status, the captured stdout, its last stderr lines."""

    returncode: int
    stdout: bytes
    stderr_tail: tuple[str, ...]

    @property
    def last_error(self) -> str:
        """The line of standard error that says what failed, for an error message.

        The last line that starts with ``Error``/``fatal:`` (OpenTofu frames
        its diagnostics in box-drawing characters, which are taken off), else
        the last non-empty line.
        """
        lines = [line.strip().lstrip("\u2502\u2577\u2575 ").strip() for line in self.stderr_tail]
        lines = [line for line in lines if line]
        for line in reversed(lines):
            if line.lower().startswith(_ERROR_PREFIXES):
                return line
        return lines[-1] if lines else ""


def find_binary(names: Sequence[str], environment: dict[str, str]) -> str:
    """The path of the first of ``names`` on the environment's PATH."""
    for name in names:
        found = shutil.which(name, path=environment.get("PATH", os.defpath))
        if found:
            return found
    listed = " or ".join(names)
    raise ProcessError(f"{listed} is not on the agent's PATH")


async def run_process(
    argv: Sequence[str],
    *,
    cwd: Path,
    environment: dict[str, str],
    emit: Callable[[str], None],
    kill_grace: float,
    capture_stdout: bool = False,
    stdout_limit: int = 4 << 20,
) -> ProcessResult:
    """Run ``argv`` to its end; lines go to ``emit`` (stdout only if not captured).

    Raises :class:`ProcessError` if it cannot start or its captured output is
    over ``stdout_limit``; re-raises cancellation after stopping the group.
    """
    loop = asyncio.get_running_loop()
    mark = secrets.token_hex(8)
    # The channels are ours, not asyncio's: on Python 3.11 ``Process.wait()``
    # waits for its own pipes to close, which a descendant can hold open.
    # Socket pairs rather than os.pipe(): uvloop closes a pipe's descriptor
    # and then the file object wrapping it again (uvloop issue 763), which can
    # close a file another thread opened in between; a socket it detaches.
    out_read, out_write = socket.socketpair()
    err_read, err_write = socket.socketpair()
    unowned = [out_read, err_read]
    transports: list[asyncio.BaseTransport] = []
    try:
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out_write.fileno(),
                stderr=err_write.fileno(),
                cwd=cwd,
                env=environment | {MARK_VARIABLE: mark},
                start_new_session=True,
            )
        except OSError as exc:
            raise ProcessError(f"cannot start {Path(argv[0]).name}: {exc.strerror}") from exc
        finally:
            out_write.close()
            err_write.close()
        stdout = await _reader(loop, out_read, unowned, transports)
        stderr = await _reader(loop, err_read, unowned, transports)
        captured = bytearray()
        tail: deque[str] = deque(maxlen=_TAIL_LINES)

        def on_stderr(line: str) -> None:
            if line.strip():
                tail.append(line)
            emit(line)

        try:
            async with asyncio.TaskGroup() as group:
                pumps = [
                    group.create_task(
                        _capture(stdout, captured, stdout_limit)
                        if capture_stdout
                        else _pump(stdout, emit)
                    ),
                    group.create_task(_pump(stderr, on_stderr)),
                ]
                await process.wait()
                # What the process left running in its group, or outside it
                # with its mark, would hold the pipes open.
                _signal_group(process.pid, signal.SIGKILL)
                await _end_escapees(mark, Path(argv[0]).name, emit, process.pid)
                # A descendant that left the group could hold them for ever: read
                # what is there, then stop reading.
                await asyncio.wait(pumps, timeout=_DRAIN)
                for transport in transports:
                    transport.close()
        except BaseException:
            await _stop(process, kill_grace)
            await _end_escapees(mark, Path(argv[0]).name, emit, process.pid)
            raise
    finally:
        for transport in transports:
            transport.close()
        for channel in unowned:
            channel.close()
    if len(captured) > stdout_limit:
        raise ProcessError(f"{Path(argv[0]).name} wrote more than {stdout_limit} bytes of output")
    assert process.returncode is not None
    return ProcessResult(process.returncode, bytes(captured), tuple(tail))


async def _reader(
    loop: asyncio.AbstractEventLoop,
    channel: socket.socket,
    unowned: list[socket.socket],
    transports: list[asyncio.BaseTransport],
) -> asyncio.StreamReader:
    """A stream reading ``channel`` (the child's end writes), which the transport then owns."""
    reader = asyncio.StreamReader(limit=_CHUNK)
    channel.shutdown(socket.SHUT_WR)  # nothing goes to the child this way
    unowned.remove(channel)
    try:
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), channel
        )
    except BaseException:
        channel.close()
        raise
    transports.append(transport)
    return reader


async def _stop(process: asyncio.subprocess.Process, grace: float) -> None:
    """SIGTERM to the group, SIGKILL after ``grace`` (at once if cancelled again)."""
    try:
        if process.returncode is None:
            _signal_group(process.pid, signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await process.wait()
    finally:
        _signal_group(process.pid, signal.SIGKILL)
    if process.returncode is None:
        await process.wait()


async def _end_escapees(mark: str, name: str, emit: Callable[[str], None], group: int) -> None:
    """Kill what the process left running outside its group, and say so in the run's log."""
    killed = await asyncio.shield(asyncio.to_thread(kill_marked, mark, group=group))
    if killed:
        emit(
            f"[agent] stopped {killed} process{'es' if killed > 1 else ''} that {name}"
            " left running outside its process group"
        )


def kill_marked(mark: str, proc: Path = Path("/proc"), *, group: int | None = None) -> int:
    """SIGKILL every process (but this one) whose environment carries ``mark``.

    Returns how many were outside process group ``group``: the run's group was
    sent SIGKILL already, and a member still dying is found here too, but it
    did not escape. Scans until a scan finds none (at most :data:`_MAX_SCANS`),
    for a process that forks while its kin are killed. Processes whose
    environment this one may not read (another user's) are passed over;
    without ``/proc``, none is found.
    """
    needle = f"{MARK_VARIABLE}={mark}".encode()
    escaped: set[int] = set()
    for _ in range(_MAX_SCANS):
        found = [pid for pid in _pids(proc) if needle in _environment(proc / str(pid))]
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                in_group = group is not None and os.getpgid(pid) == group
                os.kill(pid, signal.SIGKILL)
                if not in_group:
                    escaped.add(pid)
        if not found:
            break
    return len(escaped)


def _pids(proc: Path) -> list[int]:
    me = os.getpid()
    try:
        names = os.listdir(proc)
    except OSError:
        return []
    return [pid for pid in (int(name) for name in names if name.isdigit()) if pid != me]


def _environment(process: Path) -> list[bytes]:
    try:
        return (process / "environ").read_bytes().split(b"\0")
    except OSError:
        return []


def _signal_group(pgid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


async def _pump(stream: asyncio.StreamReader, emit: Callable[[str], None]) -> None:
    """Send each line of ``stream`` to ``emit`` as it completes."""
    buffer = bytearray()
    dropping = False
    while chunk := await stream.read(_CHUNK):
        buffer += chunk
        while (end := buffer.find(b"\n")) >= 0:
            line = bytes(buffer[:end])
            del buffer[: end + 1]
            if dropping:
                dropping = False
            else:
                emit(_decode(line))
        if len(buffer) > _MAX_RAW_LINE:
            if not dropping:
                emit(_decode(bytes(buffer[:_MAX_RAW_LINE])) + " ...[truncated]")
            dropping = True
            buffer.clear()
    if buffer and not dropping:
        emit(_decode(bytes(buffer)))


async def _capture(stream: asyncio.StreamReader, into: bytearray, limit: int) -> None:
    """Keep at most ``limit`` + 1 bytes of ``stream``; read the rest to its end."""
    while chunk := await stream.read(_CHUNK):
        if len(into) <= limit:
            into += chunk[: limit + 1 - len(into)]


def _decode(line: bytes) -> str:
    return line.decode("utf-8", "replace").rstrip("\r")
