"""The REST API under ``/api/v1``: clusters, users, grants, kubeconfigs, audit.

``clusters`` and ``users`` are the routes (the commands' routes are
:mod:`tunnel_server.commands.api`); ``httpjson`` reads and writes their JSON.

It may import the shared packages, :mod:`tunnel_server.access`,
:mod:`tunnel_server.context`, the store, and from :mod:`tunnel_server.proxy`
what the API reports or ends (live requests, the identity prefix); never the
edge.
"""
