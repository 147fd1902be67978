"""Signing in and out: the session cookie, CSRF, the rate limit, the headers (real TLS)."""

from __future__ import annotations

import logging

import pytest
from yarl import URL

from tests.console.support import ConsoleClient, add_user, csrf_of
from tests.integration.harness import RunningServer
from tunnel_server.console.headers import CONTENT_SECURITY_POLICY
from tunnel_server.console.sessions import COOKIE


async def test_a_page_without_a_session_sends_the_browser_to_sign_in(
    client: ConsoleClient,
) -> None:
    answer = await client.get("/ui/")
    assert answer.status == 303
    assert answer.headers["Location"] == "/ui/sign-in"


async def test_signing_in_sets_a_strict_session_cookie_and_shows_the_fleet(
    server: RunningServer, client: ConsoleClient
) -> None:
    answer = await client.sign_in(server.admin_token)
    assert answer.status == 303
    cookie = answer.headers["Set-Cookie"]
    assert cookie.startswith(f"{COOKIE}=")
    attributes = {part.strip().split("=")[0].lower() for part in cookie.split(";")}
    assert {"httponly", "secure", "max-age", "path"} <= attributes
    assert "samesite=strict" in cookie.lower()
    fleet = await client.get("/ui/")
    assert fleet.status == 200
    assert "Signed in as <strong>admin</strong>" in fleet.text
    # The token is never in a page, nor in the cookie.
    assert server.admin_token not in fleet.text
    assert server.admin_token not in cookie


async def test_a_wrong_token_is_refused_and_failures_are_limited(
    client: ConsoleClient,
) -> None:
    for _ in range(5):
        answer = await client.sign_in("tat_not-a-token")
        assert answer.status == 401
        assert "not valid" in answer.text
    answer = await client.sign_in("tat_not-a-token")
    assert answer.status == 429
    assert int(answer.headers["Retry-After"]) > 0


async def test_signing_in_needs_the_forms_csrf_token(
    server: RunningServer, client: ConsoleClient
) -> None:
    await client.get("/ui/sign-in")  # the form's cookie, without its token
    answer = await client.post("/ui/sign-in", {"csrf": "forged", "token": server.admin_token})
    assert answer.status == 403
    assert f"{COOKIE}=" not in answer.headers.get("Set-Cookie", "")


async def test_signing_out_ends_the_session_on_the_server(
    server: RunningServer, client: ConsoleClient
) -> None:
    await client.sign_in(server.admin_token)
    session = client.jar.filter_cookies(URL(server.url))[COOKIE].value
    answer = await client.post("/ui/sign-out", {"csrf": await client.csrf()})
    assert answer.status == 303
    assert (await client.get("/ui/")).status == 303
    # The same cookie, replayed by another browser (or on another replica), is no session.
    other = ConsoleClient(server)
    try:
        other.jar.update_cookies({COOKIE: session}, URL(server.url))
        assert (await other.get("/ui/")).status == 303
    finally:
        await other.close()


async def test_every_console_answer_has_the_security_headers(
    server: RunningServer, client: ConsoleClient
) -> None:
    for path in ("/ui/sign-in", "/ui/static/console.css"):
        answer = await client.get(path)
        assert answer.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
        assert answer.headers["X-Frame-Options"] == "DENY"
        assert answer.headers["X-Content-Type-Options"] == "nosniff"
    assert "'unsafe-inline'" not in CONTENT_SECURITY_POLICY
    assert "script-src 'self'" in CONTENT_SECURITY_POLICY
    page = await client.get("/ui/sign-in")
    assert page.headers["Cache-Control"] == "no-store"
    assert "<script>" not in page.text
    assert "style=" not in page.text


async def test_a_session_ends_with_its_token(server: RunningServer, client: ConsoleClient) -> None:
    token = await add_user(server, "ann")
    await client.sign_in(token)
    assert (await client.get("/ui/")).status == 200
    status, _ = await server.api("DELETE", "/api/v1/users/ann/tokens")
    assert status == 200
    assert (await client.get("/ui/")).status == 303


async def test_a_state_change_without_the_sessions_csrf_token_is_refused(
    server: RunningServer, client: ConsoleClient
) -> None:
    await add_user(server, "bob")
    await client.sign_in(server.admin_token)
    answer = await client.post("/ui/users/bob/revoke-tokens", {"csrf": "wrong", "confirmed": "yes"})
    assert answer.status == 403
    fleet = await client.get("/ui/")
    csrf = csrf_of(fleet.text)
    cross = await client.post(
        "/ui/users/bob/revoke-tokens",
        {"csrf": csrf, "confirmed": "yes"},
        headers={"Origin": "https://evil.example"},
    )
    assert cross.status == 403
    done = await client.post("/ui/users/bob/revoke-tokens", {"csrf": csrf, "confirmed": "yes"})
    assert done.status == 200
    assert "Revoked 1 token(s) of bob" in done.text


async def test_neither_tokens_nor_session_ids_reach_the_log(
    server: RunningServer, client: ConsoleClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    await client.sign_in("tat_a-wrong-token-of-someone")
    await client.sign_in(server.admin_token)
    session = client.jar.filter_cookies(URL(server.url))[COOKIE].value
    await client.post("/ui/sign-out", {"csrf": await client.csrf()})
    assert "console sign-in by admin" in caplog.text
    for secret in (server.admin_token, "tat_a-wrong-token-of-someone", session):
        assert secret not in caplog.text


async def test_a_signed_in_browser_keeps_its_connection_and_a_stranger_does_not(
    server: RunningServer, client: ConsoleClient
) -> None:
    """A page's assets come on the page's connection once signed in (one handshake, not
    one per asset); without a session each answer still closes its connection."""
    stranger = await client.get("/ui/sign-in")
    assert stranger.headers["Connection"] == "close"
    await client.sign_in(server.admin_token)
    page = await client.get("/ui/")
    assert page.status == 200
    assert page.headers.get("Connection", "keep-alive").lower() != "close"
