"""file:// git sources: refused unless the agent runs with --allow-file-git-sources.

Such a URL is a path in the agent's pod, not a repository server: whoever
dispatches the command would choose what the agent checks out from its own
file system (its image, its volumes) and hands to helm or tofu.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakebin import fake_environment, records
from tests.fakebin.support import Harness, command, harness
from tests.tunnel_agent.test_executors_tofu import make_repository
from tunnel_agent.executors import dispatch, execute, file_source_refusal


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    async with harness(tmp_path) as running:
        yield running


@pytest.fixture
def repository(tmp_path: Path) -> str:
    return make_repository(tmp_path / "repository", {"chart/Chart.yaml": "name: web\n"})


def _refused(field: str) -> str:
    return (
        f"{field}: this agent refuses file:// git sources, which read its own file system, "
        "not a repository server (it allows them only when started with "
        "--allow-file-git-sources)"
    )


def _specs(url: str) -> list[tuple[str, dict[str, Any], str]]:
    """(type, spec, the refused field) for each place a git source goes."""
    tofu = {"git": {"url": url, "ref": "main", "path": "infra"}}
    helm = {"namespace": "default", "chart": {"git": {"url": url, "ref": "main", "path": "chart"}}}
    query = {"name": "check", "type": "query", "get": {"apiVersion": "v1", "kind": "Namespace"}}
    flow = {"steps": [query, {"name": "app", "type": "helm", **helm}]}
    return [
        ("tofu", tofu, "spec.git.url"),
        ("helm", helm, "spec.chart.git.url"),
        ("flow", flow, "spec.steps[1].chart.git.url"),
    ]


@pytest.mark.parametrize("case", range(3), ids=["tofu", "helm", "flow"])
async def test_a_file_git_source_is_refused_naming_its_field_before_anything_runs(
    h: Harness, tmp_path: Path, repository: str, case: int
) -> None:
    type_, spec, field = _specs(repository)[case]
    record = tmp_path / "record.jsonl"
    result = await execute(command(type_, spec), h.context(fake_environment(record)))
    assert (result.outcome, result.error) == ("failed", _refused(field))
    assert records(record) == []  # neither helm nor tofu ran
    assert not any("fetching" in line or "step check" in line for line in h.lines)


async def test_with_the_flag_a_file_git_source_is_fetched(
    h: Harness, tmp_path: Path, repository: str
) -> None:
    for type_, spec, _ in _specs(repository):
        context = h.context(
            fake_environment(tmp_path / "record.jsonl"), allow_file_git_sources=True
        )
        result = await execute(command(type_, spec), context)
        assert result.outcome == "succeeded", result.error


async def test_git_itself_is_not_let_fetch_file_urls_without_the_flag(
    h: Harness, tmp_path: Path, repository: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Were the check before the run missed, git's own GIT_ALLOW_PROTOCOL still refuses."""
    monkeypatch.setattr(dispatch, "file_source_refusal", lambda command: None)
    type_, spec, _ = _specs(repository)[0]
    record = tmp_path / "record.jsonl"
    result = await execute(command(type_, spec), h.context(fake_environment(record)))
    assert result.outcome == "failed"
    assert result.error is not None
    assert result.error.startswith(f"spec.git: cannot fetch {repository} at main: ")
    assert "'file' not allowed" in result.error
    assert records(record) == []


@pytest.mark.parametrize(
    "url",
    [
        "https://git.example.com/infra.git",
        "http://git.example.com/infra.git",
        "ssh://git@git.example.com/infra.git",
        "git://git.example.com/infra.git",
        "git@git.example.com:team/infra.git",
    ],
)
def test_repository_servers_are_not_refused(url: str) -> None:
    for type_, spec, _ in _specs(url):
        assert file_source_refusal(command(type_, spec)) is None


@pytest.mark.parametrize("url", ["file:///srv/git/infra", "FILE:///srv/git/infra"])
def test_every_spelling_of_a_file_url_is_refused(url: str) -> None:
    type_, spec, field = _specs(url)[0]
    assert file_source_refusal(command(type_, spec)) == _refused(field)
