"""Git sources of charts and OpenTofu configurations: ``{url, ref, path}``.

The URL, ref and path end up on a ``git`` command line, so they are held to
shapes that cannot be read as options or reach outside the clone: a URL of
an allowed scheme with no password in it (credentials on a command line
would show in process lists and logs), a ref of branch/tag/commit
characters, a relative path without ``..``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from .errors import CommandSpecError
from .fields import Fields, describe

__all__ = ["GIT_SCHEMES", "GitSource", "parse_git_source"]

#: URL schemes a git source may use (also given to git as GIT_ALLOW_PROTOCOL).
GIT_SCHEMES = ("https", "http", "ssh", "git", "file")
# No part may start with "-": ssh would read it as an option (-oProxyCommand=...).
_SCP_LIKE = re.compile(
    r"^[A-Za-z0-9._][A-Za-z0-9._-]*@[A-Za-z0-9.][A-Za-z0-9.-]*:[A-Za-z0-9._/~-]+$"
)
_REF = re.compile(r"^(?!-)(?!.*\.\.)[A-Za-z0-9._/+-]{1,255}$")
_PATH_PART = re.compile(r"^[A-Za-z0-9._+-]+$")


@dataclass(frozen=True, slots=True)
class GitSource:
    """A directory of a git repository at a branch, tag or commit."""

    url: str
    ref: str
    path: str = "."

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.url, "ref": self.ref, "path": self.path}


def parse_git_source(raw: object, path: str) -> GitSource:
    fields = Fields(raw, path)
    url = _check_url(fields.string("url", max_length=2048), fields.path_of("url"))
    ref = fields.string("ref", pattern=_REF, rule="a branch, tag or commit", max_length=255)
    directory = fields.optional_string("path", max_length=1024) or "."
    fields.finish()
    return GitSource(url, ref, _check_path(directory, fields.path_of("path")))


def _check_url(url: str, path: str) -> str:
    if _SCP_LIKE.fullmatch(url):
        return url
    split = urlsplit(url)
    if split.scheme not in GIT_SCHEMES:
        raise CommandSpecError(path, f"must be a {', '.join(GIT_SCHEMES)} URL or user@host:path")
    if split.password is not None:
        raise CommandSpecError(
            path, "must not hold a password: it would show on the git command line"
        )
    if split.scheme != "file" and not split.hostname:
        raise CommandSpecError(path, "must name a host")
    if (split.hostname or "").startswith("-") or (split.username or "").startswith("-"):
        raise CommandSpecError(path, "must not have a host or user starting with '-'")
    if any(char.isspace() for char in url):
        raise CommandSpecError(path, "must not contain white space")
    return url


def _check_path(directory: str, path: str) -> str:
    if directory == ".":
        return directory
    parts = directory.strip("/").split("/") if not directory.startswith("/") else []
    if not parts or any(
        part in ("", ".", "..") or not _PATH_PART.fullmatch(part) for part in parts
    ):
        raise CommandSpecError(
            path, f"{describe(directory)} is not a relative path inside the repository"
        )
    return "/".join(parts)
