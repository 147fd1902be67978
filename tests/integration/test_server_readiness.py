"""The server's /readyz: ready while its store can write, 503 with the reason while not."""

from __future__ import annotations

from typing import Any

import aiohttp

from tunnel_pki.tls import client_context
from tunnel_server.store import SqliteStore

from ..tunnel_server.store.test_store_write_failure import cap_pages
from .harness import RunningServer
from .test_observability import server_metrics


async def readyz(server: RunningServer) -> tuple[int, Any, str | None]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(server.url + "/readyz", ssl=client_context(server.ca_pem)) as response,
    ):
        return response.status, await response.json(), response.headers.get("Retry-After")


async def test_readyz_fails_while_the_store_cannot_write_and_recovers_by_itself(
    server: RunningServer,
) -> None:
    store = server.context.store
    assert isinstance(store, SqliteStore)
    now = [1000.0]
    store.clock = lambda: now[0]  # probes are a second apart at least
    assert (await readyz(server))[:2] == (200, {"status": "ready"})
    await cap_pages(store, None)

    refused = 0
    groups = [f"group-{number}-{'g' * 50}" for number in range(16)]
    for number in range(500):  # users until the database has no room for one more
        status, _ = await server.api(
            "POST", "/api/v1/users", {"name": f"user-{number}", "groups": groups}
        )
        if status != 201:
            refused = status
            break
    assert refused == 503

    status, body, retry_after = await readyz(server)
    assert status == 503
    assert retry_after is not None
    assert body["error"]["message"] == (
        "not ready: the state database cannot be written (database or disk is full):"
        " free space on its volume, or make it writable"
    )
    assert (await server_metrics(server))[("tunnel_server_store_write_failing", ())] == 1

    await cap_pages(store, 1_000_000)  # space freed: no write needed to notice
    now[0] += 1.0
    assert (await readyz(server))[:2] == (200, {"status": "ready"})
    assert (await server_metrics(server))[("tunnel_server_store_write_failing", ())] == 0
