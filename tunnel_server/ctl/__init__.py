"""``tunnelctl``: the command-line client of the tunnel server's REST API.

It finds the server URL, the CA bundle to pin and its API token from
``--server``, ``--ca``, ``--token`` (or ``--token-file``), or from
``TUNNELCTL_SERVER``, ``TUNNELCTL_CA``, ``TUNNELCTL_TOKEN``
(``TUNNELCTL_TOKEN_FILE``). Errors print as one line and exit non-zero.

It speaks to the server only over HTTPS: it may import the shared packages
and its own modules, and nothing else of the server.
"""

from tunnel_server.ctl.main import main

__all__ = ["main"]
