"""A console session is the store's, not a process's: made on one replica, honoured by
another sharing the database, and ended there for both."""

from __future__ import annotations

from pathlib import Path

import pytest
from yarl import URL

from tests.console.support import ConsoleClient, add_user
from tests.integration.replicas import running_fleet
from tunnel_server.console.sessions import COOKIE


@pytest.mark.timeout(180)
async def test_a_session_made_on_one_replica_is_valid_on_another(tmp_path: Path) -> None:
    async with running_fleet(tmp_path, 2) as fleet:
        first, second = fleet.replicas
        token = await add_user(first, "ann")
        on_first, on_second = ConsoleClient(first), ConsoleClient(second)
        try:
            await on_first.sign_in(token)
            session = on_first.jar.filter_cookies(URL(first.url))[COOKIE].value
            on_second.jar.update_cookies({COOKIE: session}, URL(second.url))
            fleet_page = await on_second.get("/ui/")
            assert fleet_page.status == 200
            assert "Signed in as <strong>ann</strong>" in fleet_page.text
            # Signing out on the second ends the session on the first as well.
            answer = await on_second.post("/ui/sign-out", {"csrf": await on_second.csrf()})
            assert answer.status == 303
            assert (await on_first.get("/ui/")).status == 303
        finally:
            await on_first.close()
            await on_second.close()
