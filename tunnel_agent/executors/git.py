"""Fetching a git source: one commit, shallow, with the git command line.

``git init`` + ``git fetch --depth 1 origin <ref>`` + ``git checkout FETCH_HEAD``
takes a branch, a tag or a commit id alike (``clone --branch`` takes no
commit). Only the schemes :data:`tunnel_commands.sources.GIT_SCHEMES` are
allowed (``GIT_ALLOW_PROTOCOL``), and git never prompts. A checkout with a
symbolic link out of it is refused: helm and tofu follow links, and would read
(and print) the agent's own files, its service-account token among them.

``file://`` sources are refused (:func:`file_source_refusal`) unless the
agent runs with ``--allow-file-git-sources``: the spec is valid everywhere
(the server cannot know an agent's flags), but such a URL is a path in the
agent's pod, not a repository server. Whoever dispatches the command would
choose what git reads there: any repository in the image or on a mounted
volume (a node's, with ``hostPath``), checked out by the agent and handed to
helm or tofu. Tests and air-gapped installs with a mounted repository turn it on.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from tunnel_commands import Command, CommandSpec, FlowSpec, GitChart, GitSource, HelmSpec, TofuSpec
from tunnel_commands.errors import join_path
from tunnel_commands.sources import GIT_SCHEMES

from .errors import ExecutorError, ProcessError
from .process import find_binary, run_process
from .steps import Step

__all__ = ["fetch_source", "file_source_refusal", "git_sources"]


def git_sources(spec: CommandSpec, path: str = "spec") -> Iterator[tuple[str, GitSource]]:
    """Each git source of ``spec`` (a flow's steps included) with its field's path."""
    if isinstance(spec, FlowSpec):
        for index, step in enumerate(spec.steps):
            yield from git_sources(step.spec, join_path(join_path(path, "steps"), index))
    elif isinstance(spec, TofuSpec):
        yield join_path(path, "git"), spec.source
    elif isinstance(spec, HelmSpec) and isinstance(spec.chart, GitChart):
        yield join_path(join_path(path, "chart"), "git"), spec.chart.git


def file_source_refusal(command: Command) -> str | None:
    """Why ``command`` is refused by an agent without ``--allow-file-git-sources``, or None."""
    for path, source in git_sources(command.spec):
        if urlsplit(source.url).scheme == "file":
            return (
                f"{join_path(path, 'url')}: this agent refuses file:// git sources, which read "
                "its own file system, not a repository server (it allows them only when "
                "started with --allow-file-git-sources)"
            )
    return None


async def fetch_source(source: GitSource, destination: Path, step: Step, what: str) -> Path:
    """Check ``source`` out into ``destination``; the directory ``source.path`` in it.

    ``what`` names the spec field in errors (``spec.git``).
    """
    context = step.context
    git = find_binary(["git"], context.environment)
    environment = {
        **context.environment,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ALLOW_PROTOCOL": ":".join(
            scheme for scheme in GIT_SCHEMES if scheme != "file" or context.allow_file_git_sources
        ),
        "GIT_ASKPASS": "/bin/false",
    }
    destination.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 (a local directory)
    step.emit(f"fetching {source.url} at {source.ref}")
    for argv in (
        [git, "init", "--quiet", str(destination)],
        [git, "-C", str(destination), "remote", "add", "origin", source.url],
        [git, "-C", str(destination), "fetch", "--quiet", "--depth", "1", "origin", source.ref],
        [git, "-C", str(destination), "checkout", "--quiet", "FETCH_HEAD"],
    ):
        result = await run_process(
            argv,
            cwd=destination,
            environment=environment,
            emit=step.emit,
            kill_grace=context.kill_grace,
        )
        if result.returncode != 0:
            raise ProcessError(
                f"{what}: cannot fetch {source.url} at {source.ref}: {result.last_error}",
                returncode=result.returncode,
            )
    escaping = _link_out_of(destination)
    if escaping is not None:
        raise ExecutorError(
            f"{what}: {source.url} at {source.ref} has a symbolic link out of its checkout "
            f"({escaping}): refused, as a chart or module could read the agent's files through it"
        )
    directory = _checked_out(destination, source.path)
    if directory is None:
        raise ExecutorError(f"{what}.path: no directory {source.path!r} at {source.ref}")
    return directory


def _link_out_of(destination: Path) -> str | None:
    """The first symbolic link in the checkout whose target lies outside it, if any."""
    root = destination.resolve()
    for directory, subdirectories, files in os.walk(root):
        subdirectories[:] = [name for name in subdirectories if name != ".git"]
        for name in (*subdirectories, *files):
            path = Path(directory, name)
            if path.is_symlink() and not _within(path, root):
                return str(path.relative_to(root))
    return None


def _within(link: Path, root: Path) -> bool:
    try:
        return link.resolve().is_relative_to(root)
    except (OSError, RuntimeError):  # a loop of links leads nowhere it may go
        return False


def _checked_out(destination: Path, path: str) -> Path | None:
    """``path`` in the checkout if it is a directory there (a symbolic link may not leave)."""
    directory = (destination / path).resolve()
    if not directory.is_relative_to(destination.resolve()) or not directory.is_dir():
        return None
    return directory
