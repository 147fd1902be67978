"""Stream kinds, message kinds and HELLO info keys the agent and server share.

The framing layer treats them as opaque names; their meaning is fixed here so
the two sides agree (docs/protocol.md, "Application kinds").
"""

from __future__ import annotations

__all__ = [
    "HTTP_ACCESS_REVOKED",
    "INFO_AGENT_VERSION",
    "INFO_CLUSTER",
    "INFO_KUBERNETES_VERSION",
    "INFO_POD",
    "INFO_SERVER_VERSION",
    "MESSAGE_CERT_ISSUED",
    "MESSAGE_CERT_REFUSED",
    "MESSAGE_CERT_RENEW",
    "MESSAGE_COMMAND_CANCEL",
    "PATH_AGENT_CONNECT",
    "PATH_BOOTSTRAP",
    "STREAM_COMMAND",
    "STREAM_COMMAND_REPORT",
    "STREAM_HTTP",
]

#: HTTP paths on the server's one port that the agent uses.
PATH_BOOTSTRAP = "/api/v1/bootstrap"
PATH_AGENT_CONNECT = "/api/v1/agent/connect"

#: A Kubernetes API request relayed to the cluster (server -> agent).
STREAM_HTTP = "http"
#: RESET code on an ``http`` stream: the server ended the request because its
#: caller's access was taken away; the reason says how.
HTTP_ACCESS_REVOKED = 0x100
#: A command offered to the agent (server -> agent): headers ``{"id", "attempt",
#: "type", "name"}``, data the spec as one JSON record; the agent answers one
#: record ``{"accepted": bool, "reason"?}`` (docs/protocol.md, "Command streams").
STREAM_COMMAND = "command"
#: The progress of one attempt (agent -> server): headers ``{"id", "attempt"}``;
#: the agent sends records ``{"event": "started" | "resume" | "log" | "heartbeat" |
#: "result", ...}``, the server answers ``{"ack": true}`` or ``{"stale": reason}``.
STREAM_COMMAND_REPORT = "command.report"

#: Server -> agent: ``{"id", "attempt"}``; stop that attempt now.
MESSAGE_COMMAND_CANCEL = "command.cancel"

#: Agent -> server: ``{"csr": PEM}``; asks for a fresh client certificate.
MESSAGE_CERT_RENEW = "cert.renew"
#: Server -> agent: ``{"certificate": PEM, "ca": PEM}``.
MESSAGE_CERT_ISSUED = "cert.issued"
#: Server -> agent: ``{"message": str}``; renewal was refused.
MESSAGE_CERT_REFUSED = "cert.refused"

#: HELLO info keys: claims only, the certificate is what identifies an agent.
INFO_AGENT_VERSION = "agent_version"
INFO_CLUSTER = "cluster"
#: The cluster's Kubernetes version, as its API server's ``/version`` says (``gitVersion``).
INFO_KUBERNETES_VERSION = "kubernetes_version"
INFO_POD = "pod"
INFO_SERVER_VERSION = "server_version"
