"""``type: helm``: ``helm upgrade --install`` of a chart from a repository, OCI or git.

::

    spec:
      release: web-app          # the default is the command's name (<command>-<step> in a flow)
      namespace: web
      chart: {repo: https://charts.example.com, name: web, version: 1.2.3}
          # or {oci: oci://registry.example.com/charts/web, version: 1.2.3}
          # or {git: {url: https://git.example.com/charts.git, ref: main, path: charts/web}}
      values: {...}             # secretRef (and outputRef in a flow) allowed anywhere
      wait: false
      atomic: false
      timeout: 5m               # helm's --timeout; helm's own default when absent
      createNamespace: false
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, ClassVar
from urllib.parse import urlsplit

from .durations import format_duration
from .errors import CommandSpecError
from .fields import DNS_LABEL, NAME, Fields
from .sources import GitSource, parse_git_source
from .values import Scope, Value, dump_value, parse_value

__all__ = ["GitChart", "HelmChart", "HelmSpec", "OciChart", "RepoChart", "parse_helm"]

_CHART_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_VERSION = re.compile(r"^[A-Za-z0-9.+~^<>=*][A-Za-z0-9.+~^<>=*|, -]{0,127}$")
_OCI = re.compile(r"^oci://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._-]+)+$")
_MAX_TIMEOUT = 24 * 3600


@dataclass(frozen=True, slots=True)
class RepoChart:
    """A chart from a classic chart repository (``--repo URL``)."""

    repo: str
    name: str
    version: str | None = None

    def to_dict(self) -> dict[str, Any]:
        result = {"repo": self.repo, "name": self.name}
        return result | ({"version": self.version} if self.version else {})


@dataclass(frozen=True, slots=True)
class OciChart:
    """A chart from an OCI registry (``oci://...``)."""

    oci: str
    version: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"oci": self.oci} | ({"version": self.version} if self.version else {})


@dataclass(frozen=True, slots=True)
class GitChart:
    """A chart directory in a git repository."""

    git: GitSource

    def to_dict(self) -> dict[str, Any]:
        return {"git": self.git.to_dict()}


HelmChart = RepoChart | OciChart | GitChart


@dataclass(frozen=True, slots=True)
class HelmSpec:
    """A Helm release to install or upgrade."""

    TYPE: ClassVar[str] = "helm"

    release: str
    namespace: str
    chart: HelmChart
    values: dict[str, Value] = field(default_factory=dict)
    wait: bool = False
    atomic: bool = False
    timeout: int | None = None
    create_namespace: bool = False

    def to_dict(self) -> dict[str, Any]:
        result: dict[str, Any] = {
            "release": self.release,
            "namespace": self.namespace,
            "chart": self.chart.to_dict(),
            "values": dump_value(self.values),
            "wait": self.wait,
            "atomic": self.atomic,
            "createNamespace": self.create_namespace,
        }
        if self.timeout is not None:
            result["timeout"] = format_duration(self.timeout)
        return result


def parse_helm(fields: Fields, scope: Scope) -> HelmSpec:
    release = fields.optional_string(
        "release", pattern=NAME, rule="a release name of lower-case letters, digits and '-'"
    ) or scope.default_name(fields.path_of("release"), "release")
    namespace = fields.string("namespace", pattern=DNS_LABEL, rule="a namespace name")
    chart_fields = fields.mapping("chart", required=True)
    assert chart_fields is not None
    chart = _parse_chart(chart_fields)
    raw_values = fields.take("values")
    values: dict[str, Value] = {}
    if not Fields.missing(raw_values):
        if not isinstance(raw_values, dict):
            raise CommandSpecError(fields.path_of("values"), "must be a mapping")
        parsed = parse_value(raw_values, fields.path_of("values"), scope)
        if not isinstance(parsed, dict):
            raise CommandSpecError(fields.path_of("values"), "must be a mapping, not a reference")
        values = parsed
    spec = HelmSpec(
        release=release,
        namespace=namespace,
        chart=chart,
        values=values,
        wait=fields.boolean("wait", False),
        atomic=fields.boolean("atomic", False),
        timeout=fields.duration("timeout", None, maximum=_MAX_TIMEOUT),
        create_namespace=fields.boolean("createNamespace", False),
    )
    fields.finish()
    return spec


def _parse_chart(fields: Fields) -> HelmChart:
    kind = fields.one_of(("repo", "oci", "git"))
    chart: HelmChart
    if kind == "git":
        chart = GitChart(parse_git_source(fields.take("git"), fields.path_of("git")))
    else:
        version = fields.optional_string(
            "version", pattern=_VERSION, rule="a chart version or constraint"
        )
        if kind == "oci":
            oci = fields.string(
                "oci", pattern=_OCI, rule="an oci://registry/path reference", max_length=1024
            )
            chart = OciChart(oci, version)
        else:
            repo = fields.string("repo", max_length=2048)
            split = urlsplit(repo)
            if split.scheme not in ("https", "http") or not split.hostname or split.password:
                raise CommandSpecError(
                    fields.path_of("repo"), "must be an http(s) URL without a password"
                )
            name = fields.string("name", pattern=_CHART_NAME, rule="a chart name")
            chart = RepoChart(repo, name, version)
    fields.finish()
    return chart
