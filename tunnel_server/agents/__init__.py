"""The agents' side: sessions, certificates and install manifests.

``endpoint`` accepts an agent's WebSocket and runs its session; ``registry``
maps each cluster to its live session; ``takeovers`` refuses newcomers when
two agents with one certificate keep replacing each other; ``bootstrap`` trades a one-time token
and a CSR for a client certificate; ``manifest`` renders the agent's install
manifests.

It may import the shared packages, :mod:`tunnel_server.context`, the store's
interface and :mod:`tunnel_server.api.httpjson` (the JSON helpers of every
endpoint); never the edge or the proxy.
"""
