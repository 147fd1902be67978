"""The tunnel server: accepts agents, relays kubectl, dispatches commands.

It may import ``protocol`` and ``tunnel_pki``; it never imports ``tunnel_agent``.
"""

__all__: list[str] = []
