"""Commands: the durable queue's REST API and delivery to agents over the socket."""

from .api import command_view, setup_command_api
from .dispatcher import CommandDispatcher

__all__ = ["CommandDispatcher", "command_view", "setup_command_api"]
