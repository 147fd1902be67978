"""The checkout's mypyc-compiled modules: built in place, and rebuilt when stale.

``python scripts/compiled.py`` compiles the modules ``setup.py`` lists, beside
their sources, unless they were compiled from exactly these sources already
(a digest of the sources, ``setup.py`` and the compiler's version, kept in
``build/compiled.stamp``). With ``TUNNEL_PURE_PYTHON=1``, or on a machine
without a C compiler or Python's headers, it removes them instead, and
everything runs interpreted.

A compiled module is imported before its source, so one compiled from an
older source would run old code: :func:`stale_reason` says so, and the test
suite refuses to start (tests/conftest.py).
"""

from __future__ import annotations

import hashlib
import os
import runpy
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _stamp(root: Path) -> Path:
    """Where the digest of the sources the compiled files came from is kept."""
    return root / "build" / "compiled.stamp"


STAMP = _stamp(ROOT)


def compiled_sources(root: Path = ROOT) -> list[Path]:
    """The sources setup.py compiles."""
    listed = runpy.run_path(str(root / "setup.py"), run_name="compiled_modules")
    return [root / name for name in listed["COMPILED_MODULES"]]


def built_files(root: Path = ROOT) -> list[Path]:
    """The compiled files in the checkout's packages now, listed in setup.py or not."""
    return sorted(
        path
        for package in root.glob("*/__init__.py")
        for path in package.parent.rglob("*")
        if any(path.name.endswith(suffix) for suffix in EXTENSION_SUFFIXES)
    )


def source_digest(root: Path = ROOT) -> str:
    """What the compiled files must have been built from to be current."""
    digest = hashlib.sha256(f"mypy {version('mypy')}\n".encode())
    for path in [root / "setup.py", *compiled_sources(root)]:
        digest.update(f"{path.relative_to(root)}\n".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def stale_reason(root: Path = ROOT) -> str | None:
    """Why the compiled files must not be used, or None (current, or none at all)."""
    if not built_files(root):
        return None
    if not _current(root):
        return (
            "the mypyc-compiled modules are older than their sources, and would run "
            "instead of them: run `python scripts/compiled.py` to rebuild them (or "
            "TUNNEL_PURE_PYTHON=1 python scripts/compiled.py to remove them)"
        )
    return None


def remove() -> None:
    for path in built_files():
        path.unlink()
    STAMP.unlink(missing_ok=True)


def _current(root: Path) -> bool:
    stamp = _stamp(root)
    return stamp.exists() and stamp.read_text().strip() == source_digest(root)


def missing_tool() -> str | None:
    """What this machine lacks to compile C extensions, or None (setup.py decides)."""
    listed = runpy.run_path(str(ROOT / "setup.py"), run_name="compiled_modules")
    lacking: str | None = listed["missing_tool"]()
    return lacking


def build() -> None:
    """Compile in place, unless already done from these sources or impossible here."""
    if built_files() and _current(ROOT):
        return
    lacking = missing_tool()
    if lacking is not None:
        print(f"==> {lacking}: the request path runs interpreted, which is slower", flush=True)
        remove()
        return
    print("==> compiling the request path with mypyc", flush=True)
    remove()  # including any module no longer listed
    result = subprocess.run(
        [sys.executable, "setup.py", "--quiet", "build_ext", "--inplace"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        sys.stderr.write(result.stdout + result.stderr)
        sys.exit(f"compiling failed (exit {result.returncode}); TUNNEL_PURE_PYTHON=1 skips it")
    STAMP.parent.mkdir(exist_ok=True)
    STAMP.write_text(source_digest() + "\n")


def main() -> None:
    if os.environ.get("TUNNEL_PURE_PYTHON") == "1":
        remove()
    else:
        build()


if __name__ == "__main__":
    main()
