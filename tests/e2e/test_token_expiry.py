"""API tokens that expire: refused from then on, and their requests in progress ended.

The real kubectl and tunnelctl, the real server and agent (the ``tunnel`` fixture
of test_kubectl_tunnel.py). A token's expiry is moved into the past in the
store itself, as time would: the tests do not wait for a clock.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.kubestub_tests.kubectl import Kubectl
from tunnel_server.store.base import hash_token
from tunnel_server.store.sqlite_codec import encode_time

from ..support import until
from . import test_kubectl_tunnel as kubectl_e2e
from .test_kubectl_revocation import kubectl_with, tunnelctl_both, tunnelctl_run, watching
from .test_kubectl_tunnel import Tunnel

server = kubectl_e2e.server
tunnel = kubectl_e2e.tunnel


def expire(state_dir: Path, token: str) -> None:
    """Move the token's expiry into the past, in the server's own database."""
    past = encode_time(datetime.now(UTC) - timedelta(seconds=1))
    with closing(sqlite3.connect(state_dir / "state.db", isolation_level=None)) as db:
        changed = db.execute(
            "UPDATE api_tokens SET expires_at = ? WHERE token_hash = ?", (past, hash_token(token))
        ).rowcount
    assert changed == 1


async def kubectl_expiring(
    tunnel: Tunnel, ttl: str, directory: Path
) -> tuple[Kubectl, str, datetime]:
    """kubectl with a new kubeconfig of alice's whose token lives ``ttl``; the token, its expiry."""
    status, answer = await tunnel.server.api(
        "POST", f"/api/v1/users/alice/kubeconfig?cluster=prod-eu&ttl={ttl}"
    )
    assert status == 201
    kubeconfig: str = answer["kubeconfig"]
    kubectl = kubectl_with(kubeconfig.replace("https://127.0.0.1:1", tunnel.server.url), directory)
    token = kubeconfig.split("token: ")[1].split()[0]
    return kubectl, token, datetime.fromisoformat(answer["expires_at"])


async def test_a_kubeconfig_with_a_ttl_works_until_its_token_expires(
    tunnel: Tunnel, tmp_path: Path
) -> None:
    kubectl, token, expires_at = await kubectl_expiring(tunnel, "8h", tmp_path / "kc")
    assert abs(expires_at - (datetime.now(UTC) + timedelta(hours=8))) < timedelta(minutes=1)
    assert (await kubectl.run("get", "pod", "demo", "-o", "name")).stdout == "pod/demo\n"

    expire(tunnel.server.settings.state_dir, token)
    tunnel.server.context.access.invalidate()  # as its 5 s would, on its own

    refused = await kubectl.run("get", "pod", "demo")
    assert refused.returncode != 0
    assert "the API token is not valid (unknown, expired or revoked)" in refused.stderr


async def test_a_watch_ends_at_the_first_check_after_its_token_expired(
    tunnel: Tunnel, tmp_path: Path
) -> None:
    kubectl, token, _ = await kubectl_expiring(tunnel, "1h", tmp_path / "kc")
    watch = await watching(kubectl, tunnel)
    try:
        expire(tunnel.server.settings.state_dir, token)
        # Nothing on this server changed access: the periodic check finds it
        # (this is that check, run now rather than in up to 30 s).
        tunnel.server.context.access.invalidate()
        assert await tunnel.server.context.live.check() == 1
        assert "access revoked: the caller's API token expired" in await watch.line()
    finally:
        await watch.stop()
    await until(lambda: tunnel.stub.store.watcher_count == 0, max_turns=10**7)


@pytest.mark.parametrize(
    ("ttl", "message"),
    [
        ("soon", "ttl: 'soon' is not a duration; use e.g. 30s, 15m, 24h or 30d"),
        ("30s", "ttl must be at least 1m, not 30s"),
    ],
)
async def test_a_ttl_that_cannot_be_used_is_refused_with_why(
    tunnel: Tunnel, ttl: str, message: str
) -> None:
    status, answer = await tunnel.server.api("POST", f"/api/v1/users/alice/tokens?ttl={ttl}")
    assert status == 400
    assert answer["error"]["message"] == message


async def test_the_servers_maximum_bounds_every_token_and_is_the_default(
    tunnel: Tunnel,
) -> None:
    context = tunnel.server.context
    identity = dataclasses.replace(context.settings.identity, max_api_token_ttl=timedelta(days=30))
    context.settings = dataclasses.replace(context.settings, identity=identity)

    status, answer = await tunnel.server.api("POST", "/api/v1/users/alice/tokens?ttl=31d")
    assert status == 400
    assert answer["error"]["message"] == (
        "ttl must be at most 30d on this server (--max-api-token-ttl), not 31d"
    )
    status, answer = await tunnel.server.api("POST", "/api/v1/users/alice/tokens")
    assert status == 201
    expires_at = datetime.fromisoformat(answer["expires_at"])
    assert abs(expires_at - (datetime.now(UTC) + timedelta(days=30))) < timedelta(minutes=1)


async def test_tunnelctl_makes_tokens_that_expire_and_says_when(tunnel: Tunnel) -> None:
    token, said = await tunnelctl_both(tunnel, "user", "add", "bob", "--token-ttl", "12h")
    assert token.startswith("tat_")
    assert "# API token of bob; it is shown only now; it expires at " in said
    _, said = await tunnelctl_both(tunnel, "user", "token", "bob", "--ttl", "2h")
    assert said.startswith("# API token of bob; it expires at ")
    kubeconfig, said = await tunnelctl_both(
        tunnel, "kubeconfig", "--cluster", "prod-eu", "--user", "alice", "--ttl", "1d"
    )
    assert "kind: Config" in kubeconfig
    assert "# the kubeconfig's token; it expires at " in said
    tokens = await tunnel.server.context.store.list_api_tokens("bob")
    lifetimes = sorted(
        round((t.expires_at - t.created_at).total_seconds()) for t in tokens if t.expires_at
    )
    assert lifetimes == [2 * 3600, 12 * 3600]


async def test_a_users_own_kubeconfig_lives_no_longer_than_the_token_that_asked(
    tunnel: Tunnel,
) -> None:
    status, made = await tunnel.server.api(
        "POST", "/api/v1/users", {"name": "bob", "token_ttl": "1h"}
    )
    assert status == 201
    await tunnel.server.api("PUT", "/api/v1/grants/bob/prod-eu", {})
    for ttl in ("", "&ttl=8h"):  # none asked, then a longer one
        status, answer = await tunnel.server.api(
            "POST", f"/api/v1/users/bob/kubeconfig?cluster=prod-eu{ttl}", token=made["token"]
        )
        assert status == 201
        assert answer["expires_at"] == made["expires_at"]
    status, answer = await tunnel.server.api(
        "POST", "/api/v1/users/bob/kubeconfig?cluster=prod-eu&ttl=10m", token=made["token"]
    )
    assert datetime.fromisoformat(answer["expires_at"]) < datetime.fromisoformat(
        made["expires_at"]
    )  # a shorter one, as asked


async def test_a_ttl_too_long_for_any_token_is_refused_before_anything_changes(
    tunnel: Tunnel,
) -> None:
    status, answer = await tunnel.server.api(
        "POST", "/api/v1/users", {"name": "bob", "token_ttl": "4000d"}
    )
    assert (status, answer["error"]["message"]) == (400, "ttl must be at most 3650d, not 4000d")
    _, users = await tunnel.server.api("GET", "/api/v1/users")
    assert "bob" not in [user["name"] for user in users]

    status, answer = await tunnel.server.api(
        "POST", "/api/v1/users/alice/tokens?revoke_others=1&ttl=99999999999d"
    )
    assert status == 400
    assert "too long a duration" in answer["error"]["message"]
    still = await tunnel.kubectl.run("get", "pod", "demo", "-o", "name")
    assert still.stdout == "pod/demo\n"  # alice's tokens were not revoked


async def test_tunnelctl_passes_an_empty_ttl_on_to_be_refused(tunnel: Tunnel) -> None:
    code, stdout, stderr = await tunnelctl_run(tunnel, "user", "token", "alice", "--ttl", "")
    assert (code, stdout) == (1, "")
    assert "ttl: '' is not a duration" in stderr
