"""Commands: the durable queue's REST API and delivery to agents over the socket."""

from tunnel_server.commands.api import command_view, setup_command_api
from tunnel_server.commands.dispatcher import CommandDispatcher

__all__ = ["CommandDispatcher", "command_view", "setup_command_api"]
