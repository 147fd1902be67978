"""The ``metav1.Status`` failure body, as the API server answers errors.

Both sides of the tunnel answer their own refusals this way, so that kubectl
prints them as it prints the API server's.
"""

from __future__ import annotations

import json

__all__ = ["error_answer", "status_body", "warning_header"]

#: In the Accept header of a client asking for aggregated discovery.
_AGGREGATED_DISCOVERY = "apidiscovery.k8s.io"
JSON = "application/json"
PLAIN_TEXT = "text/plain; charset=utf-8"
#: Characters of a message put in a Warning header.
MAX_WARNING = 512


def status_body(code: int, reason: str, message: str) -> bytes:
    """The JSON body of a failed request: ``code`` (HTTP status), ``reason``, ``message``."""
    return json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        }
    ).encode()


def error_answer(code: int, reason: str, message: str, accept: str) -> tuple[bytes, str]:
    """The body of a refusal, and its Content-Type, for a client that sent ``accept``.

    A Status in JSON, except for a client asking for aggregated discovery
    first (the first media range of its ``Accept``):
    the first request of most kubectl commands, whenever kubectl's discovery
    cache is empty (a new machine, a CI job). client-go cannot read a Status
    from that answer, and prints ``Error from server (Forbidden): unknown``;
    a ``text/plain`` body it prints as it is.
    """
    if _AGGREGATED_DISCOVERY in accept.partition(",")[0]:
        return f"{message}\n".encode(), PLAIN_TEXT
    return status_body(code, reason, message), JSON


def warning_header(text: str) -> str:
    """``text`` as a Warning header value, which kubectl prints (``299 - "..."``, RFC 7234)."""
    shown = "".join(c if " " <= c <= "~" else "?" for c in text[:MAX_WARNING])
    return '299 - "' + shown.replace("\\", "\\\\").replace('"', '\\"') + '"'
