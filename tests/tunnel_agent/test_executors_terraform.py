"""The tofu executor running a real ``terraform`` (the fallback when ``tofu`` is absent).

The configuration uses only ``terraform_data`` (built into Terraform, nothing
to download) and the ``local`` backend the spec may choose, since the
``kubernetes`` backend needs a real cluster. The PATH holds only ``terraform``
and ``git``, so the fallback is what runs.

Terraform must be installed: without it these tests fail, naming what is
missing, unless ``TUNNEL_TEST_NO_TERRAFORM=1`` says to skip them on purpose.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.fakebin.support import Harness, command, harness
from tests.tunnel_agent.file_sources import allowing_file_sources
from tunnel_agent.executors import execute

SECRET = "s3cr3t-Pa55w0rd"
MAIN_TF = """
variable "greeting" {
  type = string
}
variable "zones" {
  type = list(string)
}
variable "db_password" {
  type      = string
  sensitive = true
}
resource "terraform_data" "greeting" {
  input = "${var.greeting} from ${length(var.zones)} zones"
}
output "message" {
  value = terraform_data.greeting.output
}
output "zones" {
  value = var.zones
}
output "password" {
  value     = var.db_password
  sensitive = true
}
"""


@pytest.fixture
def tools(tmp_path: Path) -> dict[str, str]:
    """A PATH with only terraform and git on it."""
    terraform = shutil.which("terraform")
    if terraform is None:
        if os.environ.get("TUNNEL_TEST_NO_TERRAFORM") == "1":
            pytest.skip("TUNNEL_TEST_NO_TERRAFORM=1: the real terraform tests are turned off")
        pytest.fail(
            "terraform is not on the PATH: install it (these tests run a real terraform), "
            "or set TUNNEL_TEST_NO_TERRAFORM=1 to skip them on purpose"
        )
    git = shutil.which("git")
    assert git is not None, "git is needed to fetch the configuration"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "terraform").symlink_to(terraform)
    (bin_dir / "git").symlink_to(git)
    return {"PATH": str(bin_dir), "HOME": str(tmp_path), "TF_CLI_CONFIG_FILE": os.devnull}


@pytest.fixture
def repository(tmp_path: Path) -> tuple[str, str]:
    """A git repository holding the configuration; its URL and its commit id."""
    path = tmp_path / "repository"
    path.mkdir()
    (path / "main.tf").write_text(MAIN_TF)
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@example.com", "-C", str(path)]
    subprocess.run(["git", "init", "--quiet", "-b", "main", str(path)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "--quiet", "-m", "config"], check=True)
    commit = subprocess.run(
        [*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    return f"file://{path}", commit


@pytest.fixture
async def h(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Harness]:
    async with harness(tmp_path) as running:
        allowing_file_sources(running, monkeypatch)
        running.stub.add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "web"}})
        running.add_secret("web", "db", {"password": SECRET})
        yield running


def _spec(url: str, ref: str, **extra: object) -> dict[str, object]:
    return {
        "git": {"url": url, "ref": ref},
        "variables": {
            "greeting": "hello",
            "zones": ["a", "b", "c"],
            "db_password": {"secretRef": {"namespace": "web", "name": "db", "key": "password"}},
        },
        "backend": {"local": True},
        **extra,
    }


async def test_a_real_terraform_applies_and_its_outputs_reach_the_secret(
    h: Harness, tools: dict[str, str], repository: tuple[str, str]
) -> None:
    url, commit = repository
    cmd = command(
        "tofu",
        _spec(url, commit),
        outputsSecret={"namespace": "web", "name": "web-app-outputs"},
    )
    result = await execute(cmd, h.context(tools))
    assert result.outcome == "succeeded", (result.error, h.lines[-20:])
    assert result.summary["binary"] == "terraform"
    assert result.summary["resources"] == {"add": 1, "change": 0, "destroy": 0}
    assert result.outputs == ["message", "password", "zones"]
    assert h.secret_data("web", "web-app-outputs") == {
        "message": "hello from 3 zones",
        "password": SECRET,
        "zones": '["a", "b", "c"]',
    }
    assert "Apply complete! Resources: 1 added, 0 changed, 0 destroyed." in h.lines
    assert SECRET not in h.log_text()
    assert SECRET not in json.dumps(result.to_dict())


async def test_a_real_terraform_plan_reports_changes_and_changes_nothing(
    h: Harness, tools: dict[str, str], repository: tuple[str, str]
) -> None:
    url, _ = repository
    cmd = command(
        "tofu",
        _spec(url, "main", plan=True),
        outputsSecret={"namespace": "web", "name": "web-app-outputs"},
    )
    context = h.context(tools)
    result = await execute(cmd, context)
    assert result.outcome == "succeeded", (result.error, h.lines[-20:])
    assert result.summary["changes"] is True
    assert result.summary["resources"] == {"add": 1, "change": 0, "destroy": 0}
    assert result.outputs == []
    assert not (context.workdir / "terraform.tfstate").exists()
    assert h.secret_data("web", "web-app-outputs") is None


async def test_a_real_terraform_error_fails_with_its_message(
    h: Harness, tools: dict[str, str], repository: tuple[str, str]
) -> None:
    url, _ = repository
    spec = _spec(url, "main")
    del spec["variables"]
    result = await execute(command("tofu", spec), h.context(tools))
    assert result.outcome == "failed"
    assert result.error is not None
    assert result.error == (
        "spec: terraform apply failed (exit 1): Error: No value for required variable"
    )
