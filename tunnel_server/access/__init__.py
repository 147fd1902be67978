"""Who a caller is and what they may reach.

``auth`` turns a bearer token into a user (and refuses what is not one);
``cache`` answers (token hash -> user) and (user, cluster -> grant) from the
store, briefly cached, and says when access changes.

It may import the shared packages, ``context``, ``errors`` and the store's
interface; nothing else of the server.
"""
