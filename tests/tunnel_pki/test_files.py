"""Atomic mode-0600 files for secrets (tunnel_pki.files)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tunnel_pki.files import create_private_file, write_private_file, write_private_files


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def permissive_umask() -> Iterator[None]:
    """A umask of 0, so that only the code under test can keep the mode narrow."""
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.mark.usefixtures("permissive_umask")
def test_write_private_file_creates_mode_0600(tmp_path: Path) -> None:
    path = tmp_path / "agent.key"
    write_private_file(path, b"secret")
    assert path.read_bytes() == b"secret"
    assert _mode(path) == 0o600


@pytest.mark.usefixtures("permissive_umask")
def test_write_private_file_replaces_a_wider_file_with_mode_0600(tmp_path: Path) -> None:
    path = tmp_path / "agent.key"
    path.write_bytes(b"old")
    path.chmod(0o644)
    write_private_file(str(path), b"new")
    assert path.read_bytes() == b"new"
    assert _mode(path) == 0o600


def test_write_private_file_leaves_only_the_target_behind(tmp_path: Path) -> None:
    write_private_file(tmp_path / "a.key", b"one")
    write_private_file(tmp_path / "a.key", b"two")
    assert [p.name for p in tmp_path.iterdir()] == ["a.key"]


def test_write_private_file_writes_large_data_whole(tmp_path: Path) -> None:
    data = os.urandom(1 << 20)
    write_private_file(tmp_path / "big", data)
    assert (tmp_path / "big").read_bytes() == data


def test_write_private_file_renames_a_complete_file_into_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "agent.key"
    path.write_bytes(b"old")
    renames: list[tuple[str, bytes, int]] = []
    original = os.replace

    def spy(source: str, target: str) -> None:
        # At the rename the new content is complete, in the same directory, already 0600,
        # and the target still holds the old content.
        renames.append((source, Path(source).read_bytes(), _mode(Path(source))))
        assert path.read_bytes() == b"old"
        original(source, target)

    monkeypatch.setattr(os, "replace", spy)
    write_private_file(path, b"new")
    [(source, content, mode)] = renames
    assert os.path.dirname(source) == str(tmp_path)
    assert (content, mode) == (b"new", 0o600)
    assert path.read_bytes() == b"new"


def test_write_private_file_keeps_the_old_content_when_the_rename_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "agent.key"
    path.write_bytes(b"old")

    def fail(source: str, target: str) -> None:
        raise OSError("simulated rename failure")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="simulated"):
        write_private_file(path, b"new")
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["agent.key"]


def test_write_private_file_keeps_the_old_content_when_the_write_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "agent.key"
    path.write_bytes(b"old")

    def fail(fd: int) -> None:
        raise OSError("simulated disk full")

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(OSError, match="disk full"):
        write_private_file(path, b"new")
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["agent.key"]


def test_write_private_files_replaces_none_when_one_cannot_be_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "tls.key").write_bytes(b"old key")
    (tmp_path / "tls.crt").write_bytes(b"old cert")
    real_fsync = os.fsync
    calls = 0

    def full_at_the_second(fd: int) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:  # the certificate's: the disk is full
            raise OSError("simulated disk full")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", full_at_the_second)
    with pytest.raises(OSError, match="disk full"):
        write_private_files(tmp_path, {"tls.key": b"new key", "tls.crt": b"new cert"})
    # Not a new key beside the old certificate: both old, and nothing else left.
    assert (tmp_path / "tls.key").read_bytes() == b"old key"
    assert (tmp_path / "tls.crt").read_bytes() == b"old cert"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tls.crt", "tls.key"]


def test_write_private_files_writes_every_file_private(tmp_path: Path) -> None:
    write_private_files(tmp_path, {"tls.key": b"key", "tls.crt": b"cert"})
    assert (tmp_path / "tls.key").read_bytes() == b"key"
    assert (tmp_path / "tls.crt").read_bytes() == b"cert"
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in tmp_path.iterdir())


def test_write_private_file_replaces_a_symlink_instead_of_following_it(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(b"untouched")
    link = tmp_path / "agent.key"
    link.symlink_to(elsewhere)
    write_private_file(link, b"secret")
    assert not link.is_symlink()
    assert link.read_bytes() == b"secret"
    assert elsewhere.read_bytes() == b"untouched"


def test_create_private_file_refuses_an_existing_path(tmp_path: Path) -> None:
    path = tmp_path / "taken"
    path.write_bytes(b"old")
    with pytest.raises(FileExistsError):
        create_private_file(path, b"new")
    assert path.read_bytes() == b"old"
