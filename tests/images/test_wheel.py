"""The wheel the images install: built from the .dockerignore'd context, with its entry points.

The wheel is built once per module from a copy of exactly what .dockerignore
lets into the build context, as the images' build stage builds it, then
installed (without dependencies) into a fresh virtual environment whose
console scripts are run.
"""

from __future__ import annotations

import configparser
import fnmatch
import importlib
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from scripts.compiled import compiled_sources

from .dockerfiles import REPO

# The wheel fixture builds with a pip of its own, fetching the build requirements
# and compiling: past the suite's per-test limit; its subprocess has a timeout.
pytestmark = pytest.mark.timeout(1200)

SCRIPTS = {
    "tunnel-agent": "tunnel_agent.cli:main",
    "tunnel-server": "tunnel_server.cli:main",
    "tunnelctl": "tunnel_server.ctl:main",
}


def _dockerignore() -> list[tuple[bool, str]]:
    """(included, pattern) per line, in order; the last matching line decides."""
    rules = []
    for line in (REPO / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            rules.append((line.startswith("!"), line.lstrip("!")))
    return rules


def _included(relative: str) -> bool:
    """Whether the build context holds ``relative`` (a path or one of its parents matches)."""
    verdict = False
    parts = relative.split("/")
    candidates = ["/".join(parts[: index + 1]) for index in range(len(parts))]
    for included, pattern in _dockerignore():
        bare = pattern.removeprefix("**/")
        for candidate in candidates:
            name = candidate.rsplit("/", 1)[-1]
            if fnmatch.fnmatchcase(candidate, pattern) or (
                pattern.startswith("**/") and fnmatch.fnmatchcase(name, bare)
            ):
                verdict = included
    return verdict


def _context(target: Path) -> Path:
    """Copy what the build context would hold into ``target``."""
    for path in sorted(REPO.rglob("*")):
        relative = path.relative_to(REPO).as_posix()
        if relative.startswith((".venv/", ".git/")) or not path.is_file():
            continue
        if _included(relative):
            destination = target / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, destination)
    return target


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel ``pip wheel .`` builds from the context, as the images' build stage does:
    with a pip of its own, not this project's environment."""
    context = _context(tmp_path_factory.mktemp("context"))
    out = tmp_path_factory.mktemp("wheels")
    builder = tmp_path_factory.mktemp("builder")
    subprocess.run([sys.executable, "-m", "venv", str(builder)], check=True, timeout=120)
    environment = {
        name: value
        for name, value in os.environ.items()
        if name not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "TUNNEL_PURE_PYTHON")
    }
    run = subprocess.run(
        [str(builder / "bin" / "python"), "-m", "pip", "wheel", "--no-deps",
         "--wheel-dir", str(out), str(context)],
        capture_output=True,
        text=True,
        env=environment,
        # pip fetches the build requirements; mypyc compiles for about a minute.
        timeout=900,
        check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    [built] = out.glob("k8s_reverse_tunnel-*.whl")
    return built


def test_the_context_leaves_out_everything_but_the_sources() -> None:
    assert _included("pyproject.toml")
    assert _included("README.md")
    assert _included("tunnel_agent/cli.py")
    assert _included("tunnel_server/manifests/agent/base/deployment.yaml")
    assert _included("protocol/frames.py")
    assert _included("setup.py")
    for excluded in (
        ".venv/bin/python",
        ".git/config",
        "tests/e2e/test_cli_e2e.py",
        "state/ca.key",
        "manifests/agent/full/values.yaml",
        "tunnel_agent/__pycache__/cli.cpython-311.pyc",
        "k8s_reverse_tunnel.egg-info/PKG-INFO",
        "protocol/connection.cpython-311-x86_64-linux-gnu.so",
    ):
        assert not _included(excluded), excluded


def test_the_wheel_declares_the_console_scripts(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        [name] = [name for name in archive.namelist() if name.endswith("entry_points.txt")]
        text = archive.read(name).decode()
    entry_points = configparser.ConfigParser()
    entry_points.read_string(text)
    assert dict(entry_points["console_scripts"]) == SCRIPTS
    for target in SCRIPTS.values():
        module, _, function = target.partition(":")
        assert callable(getattr(importlib.import_module(module), function))


def test_the_wheel_ships_the_manifests_and_every_package(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    manifests = {
        path.relative_to(REPO).as_posix()
        for path in (REPO / "tunnel_server" / "manifests").rglob("*.yaml")
    }
    assert manifests
    assert manifests <= names
    packages = {
        path.parent.relative_to(REPO).as_posix()
        for path in REPO.glob("*/__init__.py")
        if path.parent.name == "protocol" or path.parent.name.startswith("tunnel_")
    }
    for package in packages:
        assert f"{package}/__init__.py" in names, package


def test_the_wheel_carries_the_compiled_modules(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    for source in compiled_sources():
        module = source.relative_to(REPO).with_suffix("").as_posix()
        assert any(name.startswith(f"{module}.cpython-") for name in names), module


def test_the_console_scripts_run_after_installing_the_wheel(wheel: Path, tmp_path: Path) -> None:
    """pip install of the wheel makes tunnel-agent and tunnel-server that start and answer."""
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60
    )
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "--quiet", str(wheel)],
        check=True,
        timeout=110,
    )  # fmt: skip
    # The dependencies come from this environment; the project itself from the wheel.
    environment = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": sysconfig.get_paths()["purelib"],
    }

    def imported_from(module: str) -> str:
        """The file the installed environment imports ``module`` from."""
        where = subprocess.run(
            [str(python), "-c", f"import {module} as m; print(m.__file__)"],
            capture_output=True,
            text=True,
            env=environment,
            cwd=tmp_path,
            timeout=60,
            check=True,
        )  # fmt: skip
        return where.stdout.strip()

    for script, program in (("tunnel-agent", "tunnel-agent"), ("tunnel-server", "tunnel-server")):
        path = venv / "bin" / script
        assert path.exists(), script
        run = subprocess.run(
            [str(path), "--version"],
            capture_output=True,
            text=True,
            env=environment,
            cwd=tmp_path,
            timeout=60,
            check=False,
        )
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip() == f"{program} 0.1.0"
        where = imported_from(script.replace("-", "_"))
        assert where.startswith(str(venv)), where
    compiled = imported_from("protocol.connection")
    assert compiled.startswith(str(venv)), compiled
    assert compiled.endswith(".so"), compiled
