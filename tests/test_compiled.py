"""What is compiled with mypyc, and the guard against running stale compiled code."""

from __future__ import annotations

import ast
import importlib
import inspect
import shutil
import sysconfig
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

from scripts import compiled as compiled_script
from scripts.compiled import ROOT, compiled_sources, source_digest, stale_reason

COMPILED = compiled_sources()


def module_name(source: Path) -> str:
    return ".".join(source.relative_to(ROOT).with_suffix("").parts)


@pytest.mark.parametrize("source", COMPILED, ids=module_name)
def test_no_compiled_coroutine_awaits_while_an_exception_is_handled(source: Path) -> None:
    # mypyc leaves the exception being raised as the thread's current one when a
    # finally block awaits (setup.py); except blocks and async with/for, which
    # await while an exception is handled too, are kept out as well.
    found = [
        f"async with/for at line {node.lineno}"
        for node in ast.walk(ast.parse(source.read_text()))
        if isinstance(node, ast.AsyncWith | ast.AsyncFor)
    ]
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Try | ast.TryStar):
            handled = [*node.finalbody, *(s for h in node.handlers for s in h.body)]
            found += [
                f"await at line {inner.lineno}"
                for statement in handled
                for inner in ast.walk(statement)
                if isinstance(inner, ast.Await)
            ]
    assert found == []


#: Dataclasses of compiled modules made once per connection or less: their
#: generated __init__, interpreted, costs nothing that matters.
RARELY_MADE = {
    "CallerMemo",
    "ConnectionStats",
    "HandshakeCompleted",
    "HelloFrame",
    "Keepalive",
    "Limits",
    "ProxyPolicy",
    "SessionHandlers",
}


@pytest.mark.parametrize("source", COMPILED, ids=module_name)
def test_compiled_dataclasses_bring_their_own_init(source: Path) -> None:
    # dataclass() writes __init__ as Python source and runs it through exec():
    # in a compiled class it stays interpreted, about 380 ns an object against
    # 85 for one compiled, for every frame, event and request (setup.py).
    generated = []
    for node in ast.walk(ast.parse(source.read_text())):
        if not isinstance(node, ast.ClassDef) or node.name in RARELY_MADE:
            continue
        decorators = [ast.unparse(d) for d in node.decorator_list]
        if not any(d.startswith("dataclass") for d in decorators):
            continue
        own = any(isinstance(s, ast.FunctionDef) and s.name == "__init__" for s in node.body)
        if not own or not any("init=False" in d for d in decorators):
            generated.append(node.name)
    assert generated == []


def test_a_compiled_dataclass_init_is_compiled_too() -> None:
    from protocol import frames

    compiled = not (frames.__file__ or "").endswith(".py")
    assert inspect.isfunction(frames.DataFrame.__init__) is not compiled
    frame = frames.DataFrame(3, b"x")
    assert (frame.stream_id, frame.data, frame.end_stream) == (3, b"x", False)
    assert frame == frames.DataFrame(3, b"x", end_stream=False)
    assert hash(frame) == hash(frames.DataFrame(3, b"x", False))


def test_the_listed_modules_are_all_compiled_or_all_interpreted() -> None:
    compiled = {
        module_name(source): not (
            importlib.import_module(module_name(source)).__file__ or ""
        ).endswith(".py")
        for source in COMPILED
    }
    assert len(set(compiled.values())) == 1, compiled


def make_checkout(root: Path) -> Path:
    (root / "pkg").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    (root / "setup.py").write_text('COMPILED_MODULES = ["pkg/mod.py"]\n')
    module = root / "pkg" / "mod.py"
    module.write_text("ANSWER = 42\n")
    return module


def test_no_compiled_files_is_not_stale(tmp_path: Path) -> None:
    make_checkout(tmp_path)
    assert stale_reason(tmp_path) is None


def test_compiled_files_from_the_same_sources_are_current(tmp_path: Path) -> None:
    make_checkout(tmp_path)
    (tmp_path / "pkg" / f"mod{EXTENSION_SUFFIXES[0]}").write_bytes(b"")
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "compiled.stamp").write_text(source_digest(tmp_path) + "\n")
    assert stale_reason(tmp_path) is None


@pytest.mark.parametrize("change", ["source", "setup.py", "no stamp"])
def test_compiled_files_from_other_sources_are_stale(tmp_path: Path, change: str) -> None:
    module = make_checkout(tmp_path)
    (tmp_path / "pkg" / f"mod{EXTENSION_SUFFIXES[0]}").write_bytes(b"")
    (tmp_path / "build").mkdir()
    stamp = tmp_path / "build" / "compiled.stamp"
    stamp.write_text(source_digest(tmp_path) + "\n")
    if change == "source":
        module.write_text("ANSWER = 43\n")
    elif change == "setup.py":
        with (tmp_path / "setup.py").open("a") as setup:
            setup.write("# another module list\n")
    else:
        stamp.unlink()
    reason = stale_reason(tmp_path)
    assert reason is not None
    assert "older than their sources" in reason
    assert "scripts/compiled.py" in reason


@pytest.mark.parametrize("package", ["pkg", "other"])
def test_a_compiled_file_of_a_module_no_longer_listed_counts(tmp_path: Path, package: str) -> None:
    make_checkout(tmp_path)
    (tmp_path / package).mkdir(exist_ok=True)
    (tmp_path / package / "__init__.py").write_text("")
    shutil.copy(tmp_path / "pkg" / "mod.py", tmp_path / package / "old.py")
    (tmp_path / package / f"old{EXTENSION_SUFFIXES[0]}").write_bytes(b"")
    assert stale_reason(tmp_path) is not None


def test_a_machine_without_a_c_compiler_runs_interpreted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert compiled_script.missing_tool() == "no C compiler (cc)"


def test_a_machine_without_python_headers_runs_interpreted(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/cc")
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"include": str(tmp_path)})
    reason = compiled_script.missing_tool()
    assert reason is not None
    assert "Python.h" in reason
