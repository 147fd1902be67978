"""TCP keepalive on connections that carry Kubernetes API requests.

A peer can vanish without a FIN: a laptop that sleeps in the middle of
``kubectl exec`` or ``logs -f`` (the server's connection from the caller), an
API server whose node died (the agent's connection to it). With nothing to
write, the connection, its stream over the agent's session and the request
at the other end would be held for as long as the request runs: for an exec
session or a quiet ``logs -f``, for ever. The kernel's keepalive probes find
the silent peer; the connection then fails and its request ends.

The timing is Go's default, which the Kubernetes API server's listener has
(client-go's dialer uses 30 s): probes after 15 s of silence, 15 s apart;
four unanswered ones end the connection, so a vanished peer is noticed
within about 75 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

__all__ = ["IDLE_SECONDS", "INTERVAL_SECONDS", "PROBES", "enable_tcp_keepalive"]

IDLE_SECONDS = 15
INTERVAL_SECONDS = 15
PROBES = 4

_OPTIONS = (
    ("TCP_KEEPIDLE", IDLE_SECONDS),
    ("TCP_KEEPINTVL", INTERVAL_SECONDS),
    ("TCP_KEEPCNT", PROBES),
)


def enable_tcp_keepalive(transport: asyncio.BaseTransport) -> None:
    """Turn on keepalive probes for the transport's TCP socket (anything else: nothing)."""
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    with contextlib.suppress(OSError):  # a socket already closed by its peer
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in _OPTIONS:
            option = getattr(socket, name, None)  # Linux has all three; others may not
            if option is not None:
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
