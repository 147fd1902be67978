"""Several server replicas on one PostgreSQL database.

- ``membership``: the agent sessions this replica holds (claims with epochs,
  leases renewed by heartbeat, fencing), and where the others' are;
- ``links``: the mTLS links between replicas, dialed on first use;
- ``relay``: the owner's side of a request another replica forwarded;
- ``changes``: what other replicas changed, applied here as the database
  announces it (access, revocations, commands, claims).

It may import the store, the agents' registry, the relay's live requests,
the command dispatcher, the protocol and the shared packages; never the
context, the edge or the APIs. A server on SQLite is one replica alone: the
same objects, with nothing to share.
"""
