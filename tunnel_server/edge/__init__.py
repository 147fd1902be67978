"""The edge: the server's one TLS port and its callers' connections.

The listener admits connections (handshake slots per source address,
``clienthello``, ``handshakes``, ``fdlimit``); the front door (``frontdoor``,
``http1``, ``buffers``, ``callerlimit``) reads each caller's requests, serves
plain kubectl requests through :mod:`tunnel_server.proxy`, and hands every
other connection to aiohttp.

It may import the shared packages, :mod:`tunnel_server.proxy`,
:mod:`tunnel_server.context`, ``config``, ``metrics`` and ``errors``; never the
REST API (:mod:`tunnel_server.api`), the command queue or the store directly
(tests/test_layering.py and .importlinter check).
"""
