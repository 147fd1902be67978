"""Commands the control plane sends to agents: the versioned spec and its validation.

Shared by the server (which validates a submission and answers 400 naming the
field) and the agent (which validates again before running it), so both
accept exactly the same commands. Standard library and PyYAML only; it imports
nothing from the project but :mod:`protocol.errors` (the root of the error
hierarchy).

Modules, one concept each:

- :mod:`~tunnel_commands.spec`: the envelope, :class:`Command` and :func:`parse_command`
- :mod:`~tunnel_commands.manifests`, :mod:`~tunnel_commands.helm`,
  :mod:`~tunnel_commands.tofu`, :mod:`~tunnel_commands.query`,
  :mod:`~tunnel_commands.flow`: each type's spec
- :mod:`~tunnel_commands.values`: free-form values and the ``secretRef`` /
  ``outputRef`` references in them
- :mod:`~tunnel_commands.sources`: git sources of charts and configurations
- :mod:`~tunnel_commands.documents`: reading YAML/JSON text, bounding structures
- :mod:`~tunnel_commands.fields`: reading one mapping field by field
- :mod:`~tunnel_commands.durations`: ``30s``, ``10m``, ``1h30m``
- :mod:`~tunnel_commands.errors`: :class:`CommandSpecError`
"""

from .errors import CommandSpecError
from .flow import FlowSpec, FlowStep, StepSpec
from .helm import GitChart, HelmChart, HelmSpec, OciChart, RepoChart
from .manifests import ManifestsSpec
from .query import DescribeQuery, EndpointsQuery, GetQuery, LogsQuery, Query, QuerySpec
from .sources import GitSource
from .spec import Command, CommandSpec, OutputsSecret, parse_command
from .tofu import KubernetesBackend, LocalBackend, TofuBackend, TofuSpec
from .values import OutputRef, SecretRef, Value

__all__ = [
    "Command",
    "CommandSpec",
    "CommandSpecError",
    "DescribeQuery",
    "EndpointsQuery",
    "FlowSpec",
    "FlowStep",
    "GetQuery",
    "GitChart",
    "GitSource",
    "HelmChart",
    "HelmSpec",
    "KubernetesBackend",
    "LocalBackend",
    "LogsQuery",
    "ManifestsSpec",
    "OciChart",
    "OutputRef",
    "OutputsSecret",
    "Query",
    "QuerySpec",
    "RepoChart",
    "SecretRef",
    "StepSpec",
    "TofuBackend",
    "TofuSpec",
    "Value",
    "parse_command",
]
