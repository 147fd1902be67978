"""One user cannot take all of a cluster's streams: a bound on requests in progress.

The real kubectl holds the watches, through the real server and agent (the
``tunnel`` fixture of test_kubectl_tunnel.py); the request refused is sent raw,
to see the answer as it is on the wire.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..support import until
from ..tunnel_server.frontdoor_support import assert_status_object, caller, get, request
from . import test_kubectl_tunnel as kubectl_e2e
from .test_kubectl_revocation import kubectl_for, watching
from .test_kubectl_tunnel import Tunnel

server = kubectl_e2e.server
tunnel = kubectl_e2e.tunnel

DEMO = "/k8s/clusters/prod-eu/api/v1/namespaces/default/pods/demo"


def allow_each_user(tunnel: Tunnel, requests: int) -> None:
    context = tunnel.server.context
    bound = dataclasses.replace(context.settings.tunnel, max_requests_per_user=requests)
    context.settings = dataclasses.replace(context.settings, tunnel=bound)


async def test_a_user_at_the_bound_is_answered_429_and_others_are_not(
    tunnel: Tunnel, tmp_path: Path
) -> None:
    bob = await kubectl_for(tunnel, "bob", tmp_path / "bob")
    _, made = await tunnel.server.api("POST", "/api/v1/users/bob/tokens")
    allow_each_user(tunnel, 2)
    watches = [await watching(tunnel.kubectl, tunnel, watchers=n) for n in (1, 2)]
    try:
        async with caller(tunnel.server) as connection:
            connection.send(get(tunnel, DEMO))
            refused = await connection.reply()
            assert_status_object(refused, 429, "TooManyRequests")
            assert refused.header("retry-after") == "1"
            assert refused.json()["message"] == (
                "user alice has 2 requests in progress on cluster prod-eu, the most one user "
                "may have; end some (watches, logs -f, exec, port-forward)"
            )
            # Another user is not held back by alice's requests.
            assert (await bob.run("get", "pod", "demo", "-o", "name")).stdout == "pod/demo\n"
            connection.send(request("GET", DEMO, made["token"]))
            assert (await connection.reply()).status == 200

            await watches.pop().stop()  # one of alice's requests ends: room for another
            live = tunnel.server.context.live
            await until(lambda: live.count("alice", "prod-eu") == 1, max_turns=10**7)
            connection.send(get(tunnel, DEMO))
            assert (await connection.reply()).status == 200
    finally:
        for watch in watches:
            await watch.stop()
