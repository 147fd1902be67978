"""What the agent refuses when a command is offered, before it is queued: file:// git sources."""

from __future__ import annotations

from typing import Any

import pytest

from tunnel_agent.commands import validate_spec

REFUSED = (
    "spec.steps[0].git.url: this agent refuses file:// git sources, which read its own file "
    "system, not a repository server (it allows them only when started with "
    "--allow-file-git-sources)"
)


def _flow(url: str) -> dict[str, Any]:
    step = {"name": "infra", "type": "tofu", "git": {"url": url, "ref": "main"}}
    return {"apiVersion": "tunnel/v1", "type": "flow", "name": "infra", "spec": {"steps": [step]}}


def test_an_offer_with_a_file_git_source_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"^spec\.steps\[0\]\.git\.url: ") as refused:
        validate_spec(_flow("file:///srv/git/infra"))
    assert str(refused.value) == REFUSED


def test_an_agent_started_with_the_flag_accepts_it() -> None:
    validate_spec(_flow("file:///srv/git/infra"), allow_file_git_sources=True)


def test_a_repository_server_is_accepted_without_the_flag() -> None:
    validate_spec(_flow("https://git.example.com/infra.git"))
