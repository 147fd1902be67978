"""What a proxied request is answered when it cannot go on.

A :class:`ProxyRefusal` is answered as a Kubernetes ``Status`` (by either
front end) before the answer's head; the helpers here choose it for a
cluster whose agent is offline, and for a stream that failed before the
agent answered. :func:`revocation_event` ends a JSON watch whose access was
taken away, as the API server ends one.
"""

from __future__ import annotations

from collections.abc import Iterable

from protocol import kinds
from tunnel_kube import error_answer, parse_api_request, status_body, warning_header
from tunnel_mux import SessionError, SessionTimeoutError, StreamResetError
from tunnel_server.errors import ServerError

__all__ = [
    "RECONNECT_EXPECTED",
    "ProxyRefusal",
    "dropped_refusal",
    "offline_refusal",
    "revocation_event",
    "revoked_reason",
]


class ProxyRefusal(ServerError):
    """Answer the caller with a Kubernetes Status and stop.

    ``retry``: the answer carries ``Retry-After: 1``, which kubectl and
    client-go follow up to ten times; by default for 429 and 503.
    """

    def __init__(self, code: int, reason: str, message: str, *, retry: bool | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.retry = code in (429, 503) if retry is None else retry

    def answer(self, accept: str, target: str) -> tuple[bytes, list[tuple[str, str]]]:
        """The body and headers that answer a request with ``accept`` on ``target``.

        client-go prints a refusal's message for a request on a resource, and a
        403's for any; for discovery, ``/version`` or ``/openapi`` it prints its
        own words for the status ("the server is currently unable to handle the
        request"). kubectl prints every Warning header, once per text: the
        message goes in one there.
        """
        body, content_type = error_answer(self.code, self.reason, self.message, accept)
        headers = [("content-type", content_type), ("content-length", str(len(body)))]
        if self.retry:
            headers.append(("retry-after", "1"))
        if self.code != 403 and not parse_api_request("GET", _in_cluster(target)).is_resource:
            headers.append(("warning", warning_header(self.message)))
        return body, headers


def _in_cluster(target: str) -> str:
    """The path within its cluster of a ``/k8s/clusters/{cluster}/...`` target."""
    parts = target.split("/", 4)
    return "/" + parts[4] if len(parts) == 5 else "/"


def revoked_reason(error: SessionError) -> str | None:
    """Why access was taken away, if that is what ended the stream (this server reset it)."""
    if (
        isinstance(error, StreamResetError)
        and not error.remote
        and error.code == kinds.HTTP_ACCESS_REVOKED
    ):
        return error.reason
    return None


#: An agent that left less than this long ago (seconds) is expected back soon:
#: the 503 then asks for a retry, which kubectl makes for about ten seconds.
RECONNECT_EXPECTED = 10.0


def offline_refusal(cluster: str, offline_for: float | None) -> ProxyRefusal:
    """The 503 for a cluster whose agent is not connected (``offline_for``: see
    :meth:`AgentRegistry.offline_for`).

    Only an agent that left moments ago (a restart, a reconnect) is worth
    kubectl's ten retries; for one offline longer, or never seen since this
    server started, the caller learns it at once.
    """
    if offline_for is not None and offline_for < RECONNECT_EXPECTED:
        return ProxyRefusal(
            503,
            "ServiceUnavailable",
            f"cluster {cluster} is not connected (its agent left {_span(offline_for)} ago "
            "and is expected back shortly)",
            retry=True,
        )
    since = "" if offline_for is None else f" for {_span(offline_for)}"
    return ProxyRefusal(
        503,
        "ServiceUnavailable",
        f"cluster {cluster} is not connected (its agent is offline{since})",
        retry=False,
    )


def _span(seconds: float) -> str:
    """A time span as a person reads it: ``45s``, ``12m``, ``3h 5m``, ``2d 4h``."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m"
    if whole < 86400:
        return f"{whole // 3600}h {whole % 3600 // 60}m"
    return f"{whole // 86400}d {whole % 86400 // 3600}h"


def dropped_refusal(error: SessionError, cluster: str) -> ProxyRefusal:
    """What to answer when the stream failed before the response head came."""
    revoked = revoked_reason(error)
    if revoked is not None:
        return ProxyRefusal(403, "Forbidden", f"access revoked: {revoked}")
    if isinstance(error, SessionTimeoutError):
        # A link gone dead without a word: the probe sent with this request
        # found it (Keepalive.probe_timeout). The agent reconnects on its own.
        return ProxyRefusal(
            503,
            "ServiceUnavailable",
            f"the agent of cluster {cluster} stopped answering ({error}); "
            "its session was closed and the agent reconnects on its own: retry shortly",
            # Its own keepalive may take the agent 30 s to notice: kubectl's
            # ten retries a second apart would only hold the caller up.
            retry=False,
        )
    return ProxyRefusal(502, "BadGateway", f"cluster {cluster} dropped the request: {error}")


def revocation_event(
    error: SessionError,
    verb: str,
    headers: Iterable[tuple[str, str]],
    between_events: bool,
) -> bytes | None:
    """The last event of a JSON watch that access revoked, or None for any other end.

    ``error`` ended the answer to a request of ``verb``, whose head had ``headers`` (names in lower
    case); ``between_events``: what the caller got so far ends with a whole
    event (the API server ends each with a newline). The event is the
    ``ERROR`` with a 403 ``Status`` that the API server itself sends to end a
    watch, so a client reports why it ended. After half an event it would
    only make the client report a decoding error: the answer is cut instead.
    """
    revoked = revoked_reason(error)
    if revoked is None or verb != "watch" or not between_events:
        return None
    content_type = next((value for name, value in headers if name == "content-type"), "")
    if not content_type.lower().startswith("application/json"):
        return None
    status = status_body(403, "Forbidden", f"access revoked: {revoked}")
    return b'{"type":"ERROR","object":' + status + b"}\n"
