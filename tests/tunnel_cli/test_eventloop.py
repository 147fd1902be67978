"""The commands run on uvloop when it is installed, on asyncio's loop when asked."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
from types import ModuleType

import pytest
import uvloop

from tunnel_cli import FlagError, loop_factory, run_main


async def loop_type() -> type[asyncio.AbstractEventLoop]:
    return type(asyncio.get_running_loop())


# These run outside pytest-asyncio's loop (run_main starts its own), hence sync tests.


def test_auto_runs_on_uvloop_when_it_is_installed(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tunnel_cli.eventloop")
    assert run_main(loop_type(), "auto") is uvloop.Loop
    assert "event loop: uvloop" in caplog.text


def test_uvloop_runs_on_uvloop() -> None:
    assert run_main(loop_type(), "uvloop") is uvloop.Loop


def test_asyncio_forces_the_standard_loop() -> None:
    assert not issubclass(run_main(loop_type(), "asyncio"), uvloop.Loop)


def uvloop_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.import_module

    def import_module(name: str, package: str | None = None) -> ModuleType:
        if name == "uvloop":
            raise ImportError("No module named 'uvloop'")
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", import_module)


def test_auto_falls_back_to_asyncio_without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    uvloop_missing(monkeypatch)
    name, factory = loop_factory("auto")
    assert (name, factory) == ("asyncio", asyncio.new_event_loop)


def test_insisting_on_uvloop_without_it_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    uvloop_missing(monkeypatch)
    coroutine = loop_type()
    with pytest.raises(FlagError, match="uvloop is not installed"):
        run_main(coroutine, "uvloop")
    # The coroutine was closed, not left to warn that it was never awaited.
    assert inspect.getcoroutinestate(coroutine) == inspect.CORO_CLOSED


def test_an_unknown_loop_is_refused() -> None:
    with pytest.raises(FlagError, match="must be one of auto, uvloop, asyncio"):
        loop_factory("trio")
