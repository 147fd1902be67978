"""Kubernetes API request semantics shared by the agent and the server.

What a request path and method mean to the API server (verb, resource,
namespace, subresource), as its RequestInfo does; used by the agent's policy
and the server's audit; the paths both sides refuse; and the Status body both
sides answer refusals with.
Standard library only.
"""

from .paths import UNPLAIN_PATH, is_plain_path
from .requests import ApiRequest, parse_api_request
from .status import error_answer, status_body, warning_header

__all__ = [
    "UNPLAIN_PATH",
    "ApiRequest",
    "error_answer",
    "is_plain_path",
    "parse_api_request",
    "status_body",
    "warning_header",
]
