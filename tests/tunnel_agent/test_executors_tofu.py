"""The tofu executor against the fake ``tofu`` (tests/fakebin) and the stand-in API server."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakebin import FAKEBIN, fake_environment, process_gone, records, wait_gone
from tests.fakebin.support import Harness, command, harness
from tests.tunnel_agent.file_sources import allowing_file_sources
from tunnel_agent.executors import execute
from tunnel_agent.executors.labels import MANAGED_BY, MANAGED_BY_VALUE
from tunnel_agent.executors.tofu import BACKEND_OVERRIDE

SECRET = "s3cr3t-Pa55w0rd"
PASSWORD_REF = {"secretRef": {"namespace": "vault", "name": "db", "key": "password"}}
OUTPUTS = {"outputsSecret": {"namespace": "web", "name": "web-app-outputs"}}


@pytest.fixture
async def h(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Harness]:
    async with harness(tmp_path) as running:
        allowing_file_sources(running, monkeypatch)
        for namespace in ("vault", "web"):
            running.stub.add(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
            )
        running.add_secret("vault", "db", {"password": SECRET})
        yield running


@pytest.fixture
def repository(tmp_path: Path) -> str:
    """A git repository with a configuration in ``infra/``; its file:// URL."""
    return make_repository(tmp_path / "repository")


def make_repository(
    path: Path, files: dict[str, str] | None = None, links: dict[str, str] | None = None
) -> str:
    """A repository with ``infra/main.tf``, ``files`` and symbolic ``links``; its file:// URL."""
    contents = {"infra/main.tf": 'resource "terraform_data" "x" {}\n', **(files or {})}
    for name, text in contents.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    for name, target in (links or {}).items():
        (path / name).symlink_to(target)
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@example.com", "-C", str(path)]
    subprocess.run(["git", "init", "--quiet", "-b", "main", str(path)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "--quiet", "-m", "infra"], check=True)
    return f"file://{path}"


def _exists(path: str) -> bool:
    return Path(path).exists()


def _tofu(url: str, **spec: Any) -> dict[str, Any]:
    return {"git": {"url": url, "ref": "main", "path": "infra"}} | spec


async def test_init_apply_and_output_run_in_the_configuration_directory(
    h: Harness, tmp_path: Path, repository: str
) -> None:
    record = tmp_path / "record.jsonl"
    context = h.context(fake_environment(record))
    result = await execute(command("tofu", _tofu(repository), **OUTPUTS), context)
    assert result.outcome == "succeeded", result.error
    calls = records(record)
    assert [call["argv"] for call in calls] == [
        ["init", "-input=false", "-no-color"],
        ["apply", "-auto-approve", "-input=false", "-no-color"],
        ["output", "-json", "-no-color"],
    ]
    module = Path(calls[0]["cwd"])
    assert module.name == "infra"
    assert module.is_relative_to(context.workdir)
    assert (module / "main.tf").exists()
    assert all(call["pgid"] == call["pid"] for call in calls)
    assert calls[0]["env"]["TF_IN_AUTOMATION"] == "1"


async def test_the_kubernetes_backend_is_selected_with_the_runs_own_kubeconfig(
    h: Harness, tmp_path: Path, repository: str
) -> None:
    record = tmp_path / "record.jsonl"
    spec = _tofu(repository, backend={"namespace": "infra", "secretSuffix": "web"})
    context = h.context(fake_environment(record))
    await execute(command("tofu", spec), context)
    call = records(record)[0]
    kubeconfig = call["env"]["KUBECONFIG"]
    # The gateway's, for this run only (gone with it); never the agent's.
    assert Path(kubeconfig).parent == context.workdir
    assert kubeconfig != str(h.kubeconfig)
    assert not _exists(kubeconfig)
    assert call["backend_override"] == (
        "terraform {\n"
        '  backend "kubernetes" {\n'
        '    secret_suffix = "web"\n'
        '    namespace = "infra"\n'
        f'    config_path = "{kubeconfig}"\n'
        "  }\n"
        "}\n"
    )


async def test_in_a_cluster_the_backend_keeps_state_in_the_agents_namespace_through_the_gateway(
    h: Harness, tmp_path: Path, repository: str
) -> None:
    record = tmp_path / "record.jsonl"
    context = h.context(fake_environment(record), kubeconfig=None, namespace="tunnel-system")
    await execute(command("tofu", _tofu(repository)), context)
    call = records(record)[0]
    override = call["backend_override"]
    assert 'secret_suffix = "web-app"' in override
    assert 'namespace = "tunnel-system"' in override
    assert "in_cluster_config" not in override
    assert f'config_path = "{call["env"]["KUBECONFIG"]}"' in override
    assert "KUBERNETES_SERVICE_HOST" not in call["env_names"]


async def test_variables_pass_as_tf_var_and_secrets_never_on_the_command_line(
    h: Harness, tmp_path: Path, repository: str
) -> None:
    record = tmp_path / "record.jsonl"
    variables = {
        "region": "eu-west-1",
        "replicas": 3,
        "zones": ["a", "b"],
        "tags": {"team": "web"},
        "db_password": PASSWORD_REF,
    }
    result = await execute(
        command("tofu", _tofu(repository, variables=variables)),
        h.context(fake_environment(record)),
    )
    assert result.outcome == "succeeded", result.error
    for call in records(record):
        assert {k: v for k, v in call["env"].items() if k.startswith("TF_VAR_")} == {
            "TF_VAR_region": "eu-west-1",
            "TF_VAR_replicas": "3",
            "TF_VAR_zones": '["a", "b"]',
            "TF_VAR_tags": '{"team": "web"}',
            "TF_VAR_db_password": SECRET,
        }
        assert not any(SECRET in argument for argument in call["argv"])


async def test_outputs_are_written_to_the_outputs_secret_and_only_names_returned(
    h: Harness, tmp_path: Path, repository: str
) -> None:
    spec = _tofu(repository, variables={"db_password": PASSWORD_REF})
    result = await execute(
        command("tofu", spec, **OUTPUTS), h.context(fake_environment(tmp_path / "r.jsonl"))
    )
    assert result.outcome == "succeeded", result.error
    assert result.outputs == ["endpoint", "password"]
    assert h.secret_data("web", "web-app-outputs") == {
        "endpoint": "db.internal:5432",
        "password": SECRET,
    }
    secret = h.stub.get("v1", "Secret", "web-app-outputs", "web")
    assert secret is not None
    assert secret["metadata"]["labels"] == {MANAGED_BY: MANAGED_BY_VALUE}
    assert result.summary["outputs"] == ["endpoint", "password"]
    assert "db.internal:5432" not in json.dumps(result.to_dict())
    assert SECRET not in json.dumps(result.to_dict())
    assert "outputs endpoint, password written to web/web-app-outputs" in h.lines


async def test_the_summary_counts_the_resources_changed(
    h: Harness, tmp_path: Path, repository: str
) -> None:
    result = await execute(
        command("tofu", _tofu(repository)), h.context(fake_environment(tmp_path / "r.jsonl"))
    )
    assert result.summary["resources"] == {"add": 1, "change": 0, "destroy": 0}
    assert result.summary["mode"] == "apply"
    assert result.summary["binary"] == "tofu"


async def test_without_an_outputs_secret_outputs_are_not_stored(
    h: Harness, tmp_path: Path, repository: str
) -> None:
    result = await execute(
        command("tofu", _tofu(repository)), h.context(fake_environment(tmp_path / "r.jsonl"))
    )
    assert result.outcome == "succeeded", result.error
    assert result.outputs == []
    assert (
        "outputs endpoint, password are not stored: the command names no outputsSecret" in h.lines
    )


async def test_secret_values_and_sensitive_outputs_are_masked_in_the_log(
    h: Harness, tmp_path: Path, repository: str
) -> None:
    generated = "gen-9f8e7d6c5b"
    outputs = {"token": {"sensitive": True, "type": "string", "value": generated}}
    environment = fake_environment(
        tmp_path / "r.jsonl", FAKEBIN_PRINT_VARS="1", FAKEBIN_TOFU_OUTPUTS=json.dumps(outputs)
    )
    spec = _tofu(repository, variables={"db_password": PASSWORD_REF})
    result = await execute(command("tofu", spec, **OUTPUTS), h.context(environment))
    assert result.outcome == "succeeded", result.error
    assert "debug: TF_VAR_db_password=***" in h.lines
    assert SECRET not in h.log_text()
    assert generated not in h.log_text()
    assert h.secret_data("web", "web-app-outputs") == {"token": generated}


async def test_plan_only_runs_plan_and_reports_changes(
    h: Harness, tmp_path: Path, repository: str
) -> None:
    record = tmp_path / "record.jsonl"
    result = await execute(
        command("tofu", _tofu(repository, plan=True), **OUTPUTS),
        h.context(fake_environment(record)),
    )
    assert result.outcome == "succeeded", result.error
    assert [call["argv"][0] for call in records(record)] == ["init", "plan"]
    assert records(record)[1]["argv"] == ["plan", "-input=false", "-no-color", "-detailed-exitcode"]
    assert result.summary["changes"] is True
    assert result.summary["resources"] == {"add": 1, "change": 0, "destroy": 0}
    assert result.outputs == []
    assert h.secret_data("web", "web-app-outputs") is None


async def test_a_plan_without_changes_says_so(h: Harness, tmp_path: Path, repository: str) -> None:
    environment = fake_environment(tmp_path / "r.jsonl", FAKEBIN_PLAN_CHANGES="0")
    result = await execute(command("tofu", _tofu(repository, plan=True)), h.context(environment))
    assert result.outcome == "succeeded", result.error
    assert result.summary["changes"] is False


@pytest.mark.parametrize("failing", ["init", "apply", "output"])
async def test_a_failing_tofu_subcommand_fails_the_command(
    h: Harness, tmp_path: Path, repository: str, failing: str
) -> None:
    environment = fake_environment(tmp_path / "r.jsonl", FAKEBIN_FAIL=failing)
    result = await execute(command("tofu", _tofu(repository)), h.context(environment))
    assert result.outcome == "failed"
    assert result.error == (
        f"spec: tofu {failing} failed (exit 1): "
        f"Error: {failing} failed: Invalid provider configuration"
    )


async def test_terraform_is_used_when_tofu_is_not_on_the_path(
    h: Harness, tmp_path: Path, repository: str
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "terraform").symlink_to(FAKEBIN / "tofu")
    environment = fake_environment(tmp_path / "r.jsonl", fakes=False)
    environment["PATH"] = f"{bin_dir}:{environment['PATH']}"
    result = await execute(command("tofu", _tofu(repository)), h.context(environment))
    assert result.outcome == "succeeded", result.error
    assert result.summary["binary"] == "terraform"


async def test_a_missing_directory_in_the_repository_fails_naming_the_field(
    h: Harness, tmp_path: Path, repository: str
) -> None:
    spec = {"git": {"url": repository, "ref": "main", "path": "nowhere"}}
    record = tmp_path / "r.jsonl"
    result = await execute(command("tofu", spec), h.context(fake_environment(record)))
    assert result.error == "spec.git.path: no directory 'nowhere' at main"
    assert records(record) == []


async def test_a_repository_with_a_link_out_of_its_checkout_is_refused(
    h: Harness, tmp_path: Path
) -> None:
    token = tmp_path / "token"  # as the pod's service-account token, outside the checkout
    token.write_text("the-agents-token")
    url = make_repository(tmp_path / "repository", links={"infra/notes.txt": str(token)})
    record = tmp_path / "r.jsonl"
    result = await execute(command("tofu", _tofu(url)), h.context(fake_environment(record)))
    assert result.error is not None
    assert "has a symbolic link out of its checkout (infra/notes.txt): refused" in result.error
    assert records(record) == []


async def test_a_loop_of_links_in_the_checkout_is_refused(h: Harness, tmp_path: Path) -> None:
    links = {"infra/a.tf": "b.tf", "infra/b.tf": "a.tf"}
    url = make_repository(tmp_path / "repository", links=links)
    record = tmp_path / "r.jsonl"
    result = await execute(command("tofu", _tofu(url)), h.context(fake_environment(record)))
    assert result.error is not None
    assert "has a symbolic link out of its checkout (infra/a.tf): refused" in result.error


async def test_a_link_within_the_checkout_is_followed_as_before(h: Harness, tmp_path: Path) -> None:
    files = {"common/shared.tf": 'resource "terraform_data" "y" {}\n'}
    url = make_repository(
        tmp_path / "repository", files, links={"infra/shared.tf": "../common/shared.tf"}
    )
    record = tmp_path / "r.jsonl"
    result = await execute(command("tofu", _tofu(url)), h.context(fake_environment(record)))
    assert result.outcome == "succeeded", result.error


@pytest.mark.parametrize("name", ["zzz_override.tf", "override.tf.json", "x_override.tofu"])
async def test_a_module_that_overrides_the_backend_is_refused(
    h: Harness, tmp_path: Path, name: str
) -> None:
    block = 'terraform {\n  backend "http" { address = "https://example.invalid/state" }\n}\n'
    url = make_repository(tmp_path / "repository", {f"infra/{name}": block})
    record = tmp_path / "r.jsonl"
    result = await execute(command("tofu", _tofu(url)), h.context(fake_environment(record)))
    assert result.error == (
        f"spec.git: {name} declares a backend or cloud block; the agent sets the backend "
        "itself (in the cluster), so a module may not override it"
    )
    assert records(record) == []


async def test_the_backend_file_replaces_a_link_the_module_put_in_its_place(
    h: Harness, tmp_path: Path
) -> None:
    url = make_repository(tmp_path / "repository", links={f"infra/{BACKEND_OVERRIDE}": "main.tf"})
    record = tmp_path / "r.jsonl"
    result = await execute(command("tofu", _tofu(url)), h.context(fake_environment(record)))
    assert result.outcome == "succeeded", result.error
    module = Path(records(record)[0]["cwd"])
    assert (module / "main.tf").read_text() == 'resource "terraform_data" "x" {}\n'
    assert not (module / BACKEND_OVERRIDE).is_symlink()
    assert 'backend "kubernetes"' in (module / BACKEND_OVERRIDE).read_text()


async def test_cancelling_an_apply_kills_its_process_group(
    h: Harness, tmp_path: Path, repository: str
) -> None:
    pids_file = tmp_path / "pids.json"
    environment = fake_environment(
        tmp_path / "r.jsonl", FAKEBIN_HANG="apply", FAKEBIN_PIDS=str(pids_file)
    )
    task = asyncio.create_task(
        execute(command("tofu", _tofu(repository)), h.context(environment, kill_grace=0.2))
    )
    await h.line_seen("hanging").wait()
    pids = json.loads(pids_file.read_text())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert process_gone(pids["pid"])
    assert await wait_gone(pids["child"])
