"""Certificates and keys shared by the agent and the server (not wire format).

It depends on ``cryptography`` alone.
"""

__all__: list[str] = []
