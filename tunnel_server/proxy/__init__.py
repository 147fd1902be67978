"""The kubectl relay: a Kubernetes API request's way to its cluster's agent and back.

``request`` authenticates the caller, rewrites the identity and opens the
request's stream; ``exchange`` is the request as its audit event records it;
``refusal`` is what a request is answered when it cannot go on; ``answer``
checks an agent's answer; ``live_requests`` holds the requests in progress and
ends those access no longer allows; ``kubeproxy`` serves, through aiohttp, the
requests the edge does not (upgrades, unusual framing); ``wsframes`` follows
WebSocket frames to end an upgraded connection cleanly.

It may import the shared packages, :mod:`tunnel_server.access`,
:mod:`tunnel_server.context` and the store's interface
(:mod:`tunnel_server.store.base`); never the edge, the REST API or the agents'
endpoint.
"""
