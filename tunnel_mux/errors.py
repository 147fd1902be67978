"""Errors of multiplexed sessions::

TunnelError                   (protocol.errors)
└── SessionError
    ├── SessionClosedError    the session ended; its streams with it
    │   ├── SessionTimeoutError   the peer stopped answering (no PONG in time)
    │   └── PeerProtocolError     the peer broke the protocol (code)
    └── StreamResetError      the stream was reset (code, reason, by whom)
"""

from __future__ import annotations

from protocol.errors import TunnelError, describe_code

__all__ = [
    "PeerProtocolError",
    "SessionClosedError",
    "SessionError",
    "SessionTimeoutError",
    "StreamResetError",
]


class SessionError(TunnelError):
    """A multiplexed session could not do what was asked."""


class SessionClosedError(SessionError):
    """The session has ended (the socket closed, GOAWAY with an error, a timeout)."""


class SessionTimeoutError(SessionClosedError):
    """The peer did not answer a PING in time: its link or its process is gone silent."""


class PeerProtocolError(SessionClosedError):
    """The peer broke the protocol, and this side ended the session (``code``: the GOAWAY's)."""

    def __init__(self, code: int, message: str) -> None:
        self.code = code
        super().__init__(message)


class StreamResetError(SessionError):
    """The stream was reset before it finished."""

    def __init__(self, code: int, reason: str = "", *, remote: bool = True) -> None:
        self.code = code
        self.reason = reason
        self.remote = remote
        who = "the peer" if remote else "this side"
        detail = f": {reason}" if reason else ""
        super().__init__(f"stream reset by {who} ({describe_code(code)}){detail}")
