"""The agent that runs inside each private cluster.

It keeps one outbound mTLS WebSocket to the tunnel server and serves the
streams and commands that come over it. It may import ``protocol`` and
``tunnel_pki``; it never imports ``tunnel_server``.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
