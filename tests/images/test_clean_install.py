"""A new user's ``pip install .``: in a fresh virtual environment, not the project's.

Each test copies the checkout's files (what git tracks, and what it does not
ignore), makes a virtual environment with nothing but pip, and installs the
copy as a user would: pip builds it in its isolated build environment,
fetching the build requirements and the dependencies from the package index.
Where a C compiler and Python's headers exist, the request path comes
compiled; where they do not, it installs interpreted and says so.
"""

from __future__ import annotations

import os
import re
import runpy
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from .dockerfiles import REPO

#: A clean install fetches and builds everything: mypyc alone takes about a minute.
INSTALL_TIMEOUT = 900

# Each test installs from scratch: well past the suite's per-test limit (pyproject.toml),
# and each subprocess has a timeout of its own.
pytestmark = pytest.mark.timeout(INSTALL_TIMEOUT + 120)


def _checkout(target: Path) -> Path:
    """Copy what a fresh clone of the working tree would hold into ``target``."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout.decode()
    for relative in filter(None, listed.split("\0")):
        source = REPO / relative
        if source.is_file():
            destination = target / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination)
    return target


def _fresh_venv(where: Path) -> Path:
    """A virtual environment with pip and nothing of the project's own."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, timeout=120)
    return where / "bin" / "python"


def _environment(path: str) -> dict[str, str]:
    """The machine's environment, without anything that points at the project's venv."""
    kept = {
        name: value
        for name, value in os.environ.items()
        if name not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "TUNNEL_PURE_PYTHON")
    }
    kept["PATH"] = path
    return kept


def _install(python: Path, checkout: Path, path: str) -> subprocess.CompletedProcess[str]:
    run = subprocess.run(
        [str(python), "-m", "pip", "install", "--verbose", str(checkout)],
        capture_output=True,
        text=True,
        env=_environment(path),
        cwd=checkout.parent,
        timeout=INSTALL_TIMEOUT,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    return run


def _output(argv: list[str], cwd: Path) -> str:
    """What a program of the installed environment prints, run outside the checkout."""
    run = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        env=_environment(os.environ.get("PATH", "")),
        cwd=cwd,
        timeout=60,
        check=True,
    )
    return run.stdout.strip()


def _imported_from(python: Path, module: str, cwd: Path) -> str:
    return _output([str(python), "-c", f"import {module} as m; print(m.__file__)"], cwd)


def _server_start_line(python: Path, tmp_path: Path) -> str:
    """What the installed tunnel-server says when it starts listening (then it is stopped)."""
    server = python.parent / "tunnel-server"
    with subprocess.Popen(
        [str(server), "serve", "--state-dir", str(tmp_path / "state"), "--listen", "127.0.0.1:0",
         "--public-url", "https://127.0.0.1:1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=_environment(os.environ.get("PATH", "")),
        cwd=tmp_path,
    ) as process:  # fmt: skip
        assert process.stderr is not None
        try:
            for line in process.stderr:
                if "listening on" in line:
                    return line
            raise AssertionError(f"tunnel-server exited ({process.wait(10)}) without listening")
        finally:
            process.terminate()
            process.wait(30)


def test_pip_install_in_a_fresh_venv_compiles_the_request_path(tmp_path: Path) -> None:
    """With a C compiler and headers, ``pip install .`` builds the compiled modules."""
    checkout = _checkout(tmp_path / "checkout")
    python = _fresh_venv(tmp_path / "venv")
    _install(python, checkout, os.environ.get("PATH", ""))
    version = _output([str(python.parent / "tunnel-server"), "--version"], tmp_path)
    assert version == "tunnel-server 0.1.0"
    compiled = _imported_from(python, "tunnel_server.edge.frontdoor", tmp_path)
    assert compiled.startswith(str(tmp_path / "venv")), compiled
    assert compiled.endswith(".so"), compiled
    assert "request path compiled (mypyc)" in _server_start_line(python, tmp_path)


def test_pip_install_without_a_c_compiler_runs_interpreted_and_says_so(tmp_path: Path) -> None:
    """No C compiler on PATH: the install succeeds, interpreted, with a message why."""
    checkout = _checkout(tmp_path / "checkout")
    python = _fresh_venv(tmp_path / "venv")
    # Only the venv's own programs: no cc, gcc or clang to be found.
    run = _install(python, checkout, str(python.parent))
    assert "no C compiler (cc): installing the request path interpreted" in run.stdout + run.stderr
    interpreted = _imported_from(python, "tunnel_server.edge.frontdoor", tmp_path)
    assert interpreted.startswith(str(tmp_path / "venv")), interpreted
    assert interpreted.endswith(".py"), interpreted
    line = _server_start_line(python, tmp_path)
    assert "request path interpreted (installed without a C compiler" in line


def test_the_build_names_the_missing_compiler(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """setup.py's check says which tool is missing, as the install's message does."""
    listed = runpy.run_path(str(REPO / "setup.py"), run_name="compiled_modules")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CC", "cc")
    assert listed["missing_tool"]() == "no C compiler (cc)"


def test_the_build_environment_holds_every_dependency() -> None:
    """mypyc type-checks against the dependencies: pip's build environment must have each."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())

    def names(requirements: list[str]) -> set[str]:
        return {
            re.split(r"[<>=!~; \[]", requirement, maxsplit=1)[0].lower()
            for requirement in requirements
        }

    assert names(project["project"]["dependencies"]) <= names(project["build-system"]["requires"])
