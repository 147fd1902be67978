"""Paths the tunnel refuses on both sides: those the API server could read otherwise.

Go decodes a request's path before kube-apiserver routes it, and a client
library may clean dot segments; the tunnel classifies a request (its
resource, its namespace) on the path as sent. The two readings can only
differ on a path with an encoded slash, backslash or dot, or an empty, ``.``
or ``..`` segment: ``/api/v1/namespaces/x/secrets%2Fdb`` names the Secret
``db`` to kube-apiserver and a resource called ``secrets/db`` to a reader that
splits before decoding. No client needs such a path, so both the server and
the agent refuse it: the agent does not rely on the server having done so.
"""

from __future__ import annotations

__all__ = ["UNPLAIN_PATH", "is_plain_path"]

#: Why such a path is refused (a 400).
UNPLAIN_PATH = "the path must not contain dot or encoded segments"


def is_plain_path(path: str) -> bool:
    """``path`` (starting with ``/``, without its query) can be read only one way."""
    lowered = path.lower()
    return not (
        "%2f" in lowered
        or "%5c" in lowered
        or "%2e" in lowered
        or "\\" in path
        or "//" in path
        # A fragment is the client's own; sent on, the policy and the API
        # server would each read the path differently.
        or "#" in path
        # A "." or ".." segment (the path starts with "/", and "//" is refused above).
        or "/./" in path
        or "/../" in path
        or path.endswith(("/.", "/.."))
    )
