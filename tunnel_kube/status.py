"""The ``metav1.Status`` failure body, as the API server answers errors.

Both sides of the tunnel answer their own refusals this way, so that kubectl
prints them as it prints the API server's.
"""

from __future__ import annotations

import json

__all__ = ["status_body"]


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
