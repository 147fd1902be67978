"""An in-memory filesystem per pod, for the fake commands (``ls``, ``cat``, ``tar`` ...).

Paths are absolute and normalised (``/a/../b`` is ``/b``); a pod starts with
``/``, ``/etc/hostname``, ``/tmp`` and ``/root``. Sizes are bounded so that a
runaway ``kubectl cp`` cannot exhaust memory.
"""

from __future__ import annotations

import posixpath
import time
from dataclasses import dataclass, field

__all__ = ["FileSystem", "FileSystemError", "Node", "PodFiles"]

MAX_FILE = 16 * 1024 * 1024
MAX_TOTAL = 64 * 1024 * 1024
MAX_NODES = 10_000


class FileSystemError(Exception):
    """A failed file operation; its message reads as coreutils words it (``No such file ...``)."""


@dataclass(slots=True)
class Node:
    """A file (``data`` set) or a directory (``data`` None)."""

    data: bytes | None
    mode: int
    mtime: float = field(default_factory=time.time)

    @property
    def is_dir(self) -> bool:
        """Whether this node is a directory."""
        return self.data is None


class FileSystem:
    """One pod's files."""

    def __init__(self, hostname: str = "") -> None:
        self._nodes: dict[str, Node] = {"/": Node(None, 0o755)}
        self._total = 0
        for directory in ("/etc", "/tmp", "/root", "/var", "/var/log"):
            self.mkdir(directory)
        if hostname:
            self.write("/etc/hostname", hostname.encode() + b"\n")

    @staticmethod
    def normalize(path: str, cwd: str = "/") -> str:
        """The absolute, normalised form of ``path`` relative to ``cwd``."""
        joined = posixpath.join(cwd, path)
        normal = posixpath.normpath(joined)
        return "/" + normal.lstrip("/")

    def get(self, path: str) -> Node | None:
        """The node at ``path``, or None."""
        return self._nodes.get(self.normalize(path))

    def exists(self, path: str) -> bool:
        """Whether anything is at ``path``."""
        return self.get(path) is not None

    def is_dir(self, path: str) -> bool:
        """Whether ``path`` is a directory."""
        node = self.get(path)
        return node is not None and node.is_dir

    def read(self, path: str) -> bytes:
        """The content of the file at ``path``."""
        node = self.get(path)
        if node is None:
            raise FileSystemError("No such file or directory")
        if node.data is None:
            raise FileSystemError("Is a directory")
        return node.data

    def mkdir(self, path: str, *, parents: bool = True, mode: int = 0o755) -> None:
        """Create a directory (and its parents if ``parents``)."""
        path = self.normalize(path)
        node = self._nodes.get(path)
        if node is not None:
            if not node.is_dir:
                raise FileSystemError("File exists")
            return
        parent = posixpath.dirname(path)
        if not self.is_dir(parent):
            if not parents:
                raise FileSystemError("No such file or directory")
            self.mkdir(parent, parents=True)
        self._add(path, Node(None, mode))

    def write(
        self, path: str, data: bytes, *, mode: int = 0o644, mtime: float | None = None
    ) -> None:
        """Create or replace the file at ``path`` (its directory must exist)."""
        path = self.normalize(path)
        if len(data) > MAX_FILE:
            raise FileSystemError("File too large")
        if not self.is_dir(posixpath.dirname(path)):
            raise FileSystemError("No such file or directory")
        old = self._nodes.get(path)
        if old is not None and old.is_dir:
            raise FileSystemError("Is a directory")
        old_size = len(old.data or b"") if old else 0
        if self._total - old_size + len(data) > MAX_TOTAL:
            raise FileSystemError("No space left on device")
        self._total -= old_size
        if old is not None:
            del self._nodes[path]
        self._add(path, Node(data, mode, mtime if mtime is not None else time.time()))
        self._total += len(data)

    def _add(self, path: str, node: Node) -> None:
        if len(self._nodes) >= MAX_NODES:
            raise FileSystemError("No space left on device")
        self._nodes[path] = node

    def listdir(self, path: str) -> list[str]:
        """The names in directory ``path``, sorted."""
        path = self.normalize(path)
        if not self.is_dir(path):
            raise FileSystemError(
                "Not a directory" if self.exists(path) else "No such file or directory"
            )
        prefix = path.rstrip("/") + "/"
        return sorted(
            name[len(prefix) :]
            for name in self._nodes
            if name.startswith(prefix) and name != path and "/" not in name[len(prefix) :]
        )

    def walk(self, path: str) -> list[str]:
        """``path`` and everything under it, parents before children."""
        path = self.normalize(path)
        if not self.exists(path):
            raise FileSystemError("No such file or directory")
        prefix = path.rstrip("/") + "/"
        return sorted(name for name in self._nodes if name == path or name.startswith(prefix))

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Remove a file, or a directory (with its content if ``recursive``)."""
        path = self.normalize(path)
        if path == "/":
            raise FileSystemError("Permission denied")
        node = self._nodes.get(path)
        if node is None:
            raise FileSystemError("No such file or directory")
        if node.is_dir and self.listdir(path) and not recursive:
            raise FileSystemError("Directory not empty")
        for name in self.walk(path):
            self._total -= len(self._nodes[name].data or b"")
            del self._nodes[name]


class PodFiles:
    """The filesystems of every pod, keyed by pod uid (a recreated pod starts afresh)."""

    def __init__(self) -> None:
        self._systems: dict[str, FileSystem] = {}

    def of(self, uid: str, hostname: str = "") -> FileSystem:
        """The filesystem of the pod with ``uid`` (created on first use)."""
        system = self._systems.get(uid)
        if system is None:
            system = FileSystem(hostname)
            self._systems[uid] = system
        return system

    def forget(self, uid: str) -> None:
        """Drop a deleted pod's files."""
        self._systems.pop(uid, None)
