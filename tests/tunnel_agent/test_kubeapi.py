"""The agent's own credential: asked for at most once a second, rotations followed."""

from __future__ import annotations

from kubernetes_asyncio import client

from tunnel_agent.kubeapi import CREDENTIAL_REUSE, KubeApi

from ..support import ManualClock


def configuration(token: str) -> client.Configuration:
    settings = client.Configuration(host="http://127.0.0.1:1")
    settings.api_key = {"BearerToken": token}
    settings.api_key_prefix = {"BearerToken": "Bearer"}
    return settings


async def test_the_credential_is_the_configurations_bearer_token() -> None:
    api = KubeApi(configuration("first"))
    assert await api.authorization() == "Bearer first"


async def test_a_configuration_without_a_token_gives_no_credential() -> None:
    assert await KubeApi(client.Configuration(host="http://127.0.0.1:1")).authorization() is None


async def test_a_rotated_token_is_sent_once_the_reuse_period_is_over() -> None:
    clock = ManualClock(100.0)
    settings = configuration("first")
    api = KubeApi(settings, clock=clock)
    assert await api.authorization() == "Bearer first"
    settings.api_key = {"BearerToken": "rotated"}  # what the in-cluster loader's hook does
    clock.now += CREDENTIAL_REUSE / 2
    assert await api.authorization() == "Bearer first"  # reused: not asked again yet
    clock.now += CREDENTIAL_REUSE
    assert await api.authorization() == "Bearer rotated"


async def test_the_refresh_hook_runs_at_most_once_per_reuse_period() -> None:
    clock = ManualClock(100.0)
    settings = configuration("first")
    calls: list[float] = []
    settings.refresh_api_key_hook = lambda _: calls.append(clock.now)
    api = KubeApi(settings, clock=clock)
    for _ in range(5):
        await api.authorization()
    clock.now += CREDENTIAL_REUSE
    await api.authorization()
    assert calls == [100.0, 100.0 + CREDENTIAL_REUSE]
