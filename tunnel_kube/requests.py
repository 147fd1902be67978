"""Read a Kubernetes API request the way the API server's RequestInfo does."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from urllib.parse import unquote, unquote_plus

__all__ = ["CONNECT_SUBRESOURCES", "ApiRequest", "parse_api_request"]

#: Subresources that open an interactive connection into a pod or node.
CONNECT_SUBRESOURCES = frozenset({"exec", "attach", "portforward", "proxy"})

_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch"}
#: What follows /namespaces/NS that is the namespace's own subresource, not a resource in it.
_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})


@dataclass(frozen=True, slots=True, init=False)
class ApiRequest:
    """What a request does, in Kubernetes terms.

    ``verb`` is the API verb for resource requests (get, list, watch, create,
    update, patch, delete, deletecollection) and the lower-case method for
    others (discovery, /version, /openapi).
    """

    verb: str
    is_resource: bool
    path: str
    api_group: str
    api_version: str
    namespace: str
    resource: str
    subresource: str
    name: str

    def __init__(
        self,
        verb: str,
        is_resource: bool,
        path: str,
        api_group: str = "",
        api_version: str = "",
        namespace: str = "",
        resource: str = "",
        subresource: str = "",
        name: str = "",
    ) -> None:
        object.__setattr__(self, "verb", verb)
        object.__setattr__(self, "is_resource", is_resource)
        object.__setattr__(self, "path", path)
        object.__setattr__(self, "api_group", api_group)
        object.__setattr__(self, "api_version", api_version)
        object.__setattr__(self, "namespace", namespace)
        object.__setattr__(self, "resource", resource)
        object.__setattr__(self, "subresource", subresource)
        object.__setattr__(self, "name", name)

    @property
    def is_connect(self) -> bool:
        """exec, attach, port-forward or proxy (also the legacy /proxy/ verb): a connection
        into the cluster."""
        return self.subresource in CONNECT_SUBRESOURCES or self.verb == "proxy"

    @property
    def is_read(self) -> bool:
        """Reads state and changes nothing."""
        if not self.is_resource:
            return self.verb in ("get", "head", "options")
        return self.verb in ("get", "list", "watch") and not self.is_connect


#: Targets up to this many characters are remembered, the most recent first:
#: the lists, watches and gets a client repeats. Longer ones are read every
#: time, so the cache holds a few megabytes at most (512 characters may take
#: up to 4 bytes each).
_CACHED_TARGET = 512
_CACHE_SIZE = 1024


def parse_api_request(method: str, target: str) -> ApiRequest:
    """Classify ``method`` on ``target`` (a path with an optional query)."""
    # Both sides of the tunnel classify every request; the answer depends on
    # these two strings alone and is immutable, so a repeat is looked up.
    if len(target) <= _CACHED_TARGET:
        return _remembered(method, target)
    return _parse_api_request(method, target)


def _parse_api_request(method: str, target: str) -> ApiRequest:
    # Every proxied request is classified on both sides of the tunnel, so this
    # avoids urlsplit and parse_qs (same results for the paths it sees).
    path, _, query = target.partition("#")[0].partition("?")
    stripped = path.strip("/")
    parts = stripped.split("/") if stripped else []
    if "%" in stripped:
        parts = [unquote(part) for part in parts]
    lower = method.lower()
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return ApiRequest(verb=lower, is_resource=False, path=path)
    if not rest:
        return ApiRequest(verb=lower, is_resource=False, path=path)
    # RequestInfo's special verbs: /watch/... (any method but those below is
    # read as the method says, which is stricter) and the legacy /proxy/...
    special = rest[0] if rest[0] in ("watch", "proxy") else ""
    if special:
        rest = rest[1:]
        if not rest:
            # /api/v1/watch alone names nothing (the API server refuses it).
            return ApiRequest(verb=lower, is_resource=False, path=path)
    namespace = ""
    if len(rest) >= 2 and rest[0] == "namespaces":
        # /namespaces/NS/RESOURCE/... is namespaced; /namespaces/NS alone is
        # the namespace object, whose namespace is itself, and so are its
        # own subresources (/namespaces/NS/status, /finalize).
        namespace = rest[1]
        if len(rest) >= 3 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) >= 2 else ""
    # Under /proxy/ what follows the name is the proxied path, not a subresource.
    subresource = rest[2] if len(rest) >= 3 and special != "proxy" else ""
    if special == "proxy":
        verb = "proxy"
    elif method == "GET" or method == "HEAD":
        # As the API server reads it: ?watch counts only where no object is named.
        if special == "watch":
            verb = "watch"
        elif name:
            verb = "get"
        else:
            verb = "watch" if _watch_parameter(query) else "list"
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = _VERBS.get(method, lower)
    return ApiRequest(
        verb=verb,
        is_resource=True,
        path=path,
        api_group=group,
        api_version=version,
        namespace=namespace,
        resource=resource,
        subresource=subresource,
        name=name,
    )


def _watch_parameter(query: str) -> bool:
    """Whether the query asks for a watch, as the API server decodes it.

    Go's url.ParseQuery (which passes over a pair holding ``;`` or a bad escape),
    then the first ``watch`` value: anything but ``0`` and ``false`` (any
    case) is true, an empty one and a bare ``watch`` included.
    """
    if "watch" not in query and "%" not in query:
        return False
    for item in query.split("&"):
        if ";" in item:
            continue
        name, _, value = item.partition("=")
        decoded = _query_unescape(name)
        if decoded == "watch":
            text = _query_unescape(value)
            if text is None:
                continue
            return text != "0" and text.casefold() != "false"
    return False


def _query_unescape(text: str) -> str | None:
    """Go's url.QueryUnescape: None where it fails (a ``%`` without two hex digits)."""
    if "%" in text and _BAD_ESCAPE.search(text) is not None:
        return None
    return unquote_plus(text) if "%" in text or "+" in text else text


_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


_remembered = functools.lru_cache(maxsize=_CACHE_SIZE)(_parse_api_request)
