"""Errors of the agent::

    TunnelError                        (protocol.errors)
    └── AgentError
        ├── AgentConfigError           flags or files that cannot be used
        ├── CredentialsError           the credential store failed
        ├── UpstreamError              a relayed request to the API server failed,
        │   │                          or its answer cannot be relayed
        │   ├── UpstreamConnectError   no connection (refused, unknown host, TLS, timeout)
        │   └── UpstreamRequestError   the request cannot be sent as it is
        ├── AgentStoppedError          the agent must stop: retrying cannot help
        │   ├── BootstrapRefusedError  the server refused the bootstrap token
        │   └── AgentRejectedError     the server refused the certificate (revoked ...)
        └── ConnectError               this attempt failed; retry with back-off
            └── ServerCertificateError the server's certificate does not chain to the pinned CA
                └── TlsInterceptionError  ... because a proxy intercepts TLS

Messages say what happened and what to do; they never hold tokens or keys.
"""

from __future__ import annotations

from protocol.errors import TunnelError

__all__ = [
    "AgentConfigError",
    "AgentError",
    "AgentRejectedError",
    "AgentStoppedError",
    "BootstrapRefusedError",
    "ConnectError",
    "CredentialsError",
    "ServerCertificateError",
    "TlsInterceptionError",
    "UpstreamConnectError",
    "UpstreamError",
    "UpstreamRequestError",
]


class AgentError(TunnelError):
    """The agent cannot do what it must."""


class AgentConfigError(AgentError):
    """A flag, environment variable or file of the agent cannot be used."""


class CredentialsError(AgentError):
    """The agent's credentials could not be read or stored."""


class AgentStoppedError(AgentError):
    """Retrying cannot help: a person must act (the message says how)."""


class BootstrapRefusedError(AgentStoppedError):
    """The server refused the bootstrap token (unknown, used, expired, other cluster)."""


class AgentRejectedError(AgentStoppedError):
    """The server refused the agent's certificate (revoked, cluster deleted)."""


class ConnectError(AgentError):
    """One connection attempt failed; the agent backs off and retries.

    ``retry_after`` is the wait the server asked for, if it asked.
    """

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ServerCertificateError(ConnectError):
    """The server's certificate does not chain to the pinned CA."""


class TlsInterceptionError(ServerCertificateError):
    """A proxy on the way presents its own certificate instead of the server's."""


class UpstreamError(AgentError):
    """The API server cannot be reached, or its answer cannot be relayed."""


class UpstreamConnectError(UpstreamError):
    """No connection to the API server: refused, unknown host, TLS failure, timeout."""


class UpstreamRequestError(UpstreamError):
    """The request cannot be sent as it is: unsafe characters, or a body of the wrong length."""
