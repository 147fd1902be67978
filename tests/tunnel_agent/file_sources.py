"""The executor tests' git repositories are local: file:// sources, allowed explicitly.

An agent fetches ``file://`` git sources only when started with
``--allow-file-git-sources``; these tests' contexts say so.
"""

from __future__ import annotations

import functools

import pytest

from tests.fakebin.support import Harness

__all__ = ["allowing_file_sources"]


def allowing_file_sources(h: Harness, monkeypatch: pytest.MonkeyPatch) -> Harness:
    """``h``, whose contexts allow file:// git sources unless a test says otherwise."""
    monkeypatch.setattr(h, "context", functools.partial(h.context, allow_file_git_sources=True))
    return h
