"""The agent's executors: what runs a command's spec inside the cluster.

:func:`execute` takes a validated :class:`tunnel_commands.Command` and an
:class:`ExecutionContext` and returns an :class:`ExecutionResult`; it never
raises but for cancellation. It may import ``tunnel_commands``,
``tunnel_pki`` and the agent's :mod:`~tunnel_agent.kubeapi`; the delivery
(queue, leases, log streaming) is the caller's.

Modules, one concept each:

- :mod:`.dispatch`: :func:`execute`, timeouts, outputs, the final masking
- :mod:`.flow`: flows, and routing a spec to its type's executor
- :mod:`.manifests`, :mod:`.applyset`, :mod:`.readiness`: apply, prune, wait
- :mod:`.helm`, :mod:`.tofu`, :mod:`.git`: the command-line tools
- :mod:`.query`: bounded reads of the cluster
- :mod:`.process`: subprocesses in their own process group, killed on cancel
- :mod:`.kube`: REST calls on any kind, with discovery
- :mod:`.secrets`: ``secretRef`` and ``outputRef`` resolution
- :mod:`.outputs`: the outputs Secret
- :mod:`.masking`: masking secret values out of text
- :mod:`.context`, :mod:`.steps`: what a run and a step are given and give back
- :mod:`.labels`, :mod:`.errors`
"""

from .context import ExecutionContext, ExecutionResult, subprocess_environment
from .dispatch import execute
from .errors import ExecutorError, KubeRequestError, ProcessError
from .git import file_source_refusal
from .masking import Masker
from .outputs import OutputWriter
from .secrets import OutputValue, SecretResolver, ValueResolver

__all__ = [
    "ExecutionContext",
    "ExecutionResult",
    "ExecutorError",
    "KubeRequestError",
    "Masker",
    "OutputValue",
    "OutputWriter",
    "ProcessError",
    "SecretResolver",
    "ValueResolver",
    "execute",
    "file_source_refusal",
    "subprocess_environment",
]
