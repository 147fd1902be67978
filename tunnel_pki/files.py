"""Files that hold secrets: written with mode 0600, never half-written.

:func:`write_private_file` replaces a file atomically: readers see the old
content or the new, never a mix, and the key never exists with wider
permissions, not even for a moment (the mode is set at creation, not after).
Errors are the ``OSError`` of the failing call; the caller, which knows what
the file is for, says so when it reports them.
"""

from __future__ import annotations

import contextlib
import os
import secrets

__all__ = ["PRIVATE_FILE_MODE", "create_private_file", "write_private_file", "write_private_files"]

PRIVATE_FILE_MODE = 0o600
"""Owner read and write, nobody else anything."""

_CREATE_FLAGS = (
    os.O_WRONLY
    | os.O_CREAT
    | os.O_EXCL
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
)


def create_private_file(
    path: str | os.PathLike[str], data: bytes, *, durable: bool = False
) -> None:
    """Create a new file (it must not exist) with mode 0600 holding ``data``.

    With ``durable`` the data is flushed to the disk (``fsync``) before the
    file is closed. On error the partly written file is removed.
    """
    fd = os.open(path, _CREATE_FLAGS, PRIVATE_FILE_MODE)
    try:
        try:
            # The umask can only have narrowed the mode; set it exactly all the same.
            os.fchmod(fd, PRIVATE_FILE_MODE)
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        raise


def write_private_file(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically, with mode 0600, replacing any file there.

    The data goes to a new temporary file in the same directory (mode 0600 from
    its creation, flushed with ``fsync``), which is then renamed over ``path``,
    and the directory is flushed so that the rename survives a crash. A symbolic
    link at ``path`` is replaced, not followed. On error nothing is left behind
    and ``path`` keeps its old content.
    """
    target = os.fspath(path)
    directory = os.path.dirname(target) or "."
    temporary = os.path.join(directory, f".{os.path.basename(target)}.{secrets.token_hex(8)}.tmp")
    create_private_file(temporary, data, durable=True)
    try:
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    _fsync_directory(directory)


def write_private_files(directory: str | os.PathLike[str], files: dict[str, bytes]) -> None:
    """Write each of ``files`` (name: data) into ``directory`` as :func:`write_private_file` does,
    all or none: every file is written in full before any replaces its old one.

    A full disk (the likely failure) therefore leaves the old files, all of
    them, rather than a new key beside an old certificate. The files are
    renamed in the order given.
    """
    folder = os.fspath(directory)
    staged: list[tuple[str, str]] = []
    try:
        for name, data in files.items():
            temporary = os.path.join(folder, f".{name}.{secrets.token_hex(8)}.tmp")
            create_private_file(temporary, data, durable=True)
            staged.append((temporary, os.path.join(folder, name)))
        for temporary, target in staged:
            os.replace(temporary, target)
    finally:
        for temporary, _ in staged:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
    _fsync_directory(folder)


def _fsync_directory(directory: str) -> None:
    """Flush a directory's entries, so that a rename in it is on the disk."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
