"""The tunnel server: accepts agents, relays kubectl, dispatches commands.

It may import ``protocol`` and ``tunnel_pki``; it never imports ``tunnel_agent``.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
