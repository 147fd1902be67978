"""Commands: the durable queue's REST API and delivery to agents over the socket.

``dispatcher`` offers commands to agents and records their reports; ``api`` is
its REST routes; ``specs`` the facts of a spec shown to callers. It may import
``access``, ``agents.registry``, ``api.httpjson``, ``audit``, ``config``,
``context`` (the routes only), ``metrics`` and the store; never the edge or the
proxy.
"""

from tunnel_server.commands.api import command_view, setup_command_api
from tunnel_server.commands.dispatcher import CommandDispatcher

__all__ = ["CommandDispatcher", "command_view", "setup_command_api"]
