"""A console client over real TLS (aiohttp, with a cookie jar as a browser keeps one), and
helpers the console's tests share."""

from __future__ import annotations

import json
import re
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp

from tests.integration.harness import RunningServer
from tunnel_pki.tls import client_context

_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def csrf_of(html: str) -> str:
    """The CSRF token of the first form on a page."""
    found = _CSRF.search(html)
    assert found is not None, "no form with a CSRF token on the page"
    return found.group(1)


@dataclass
class Answer:
    status: int
    text: str
    headers: Any
    url: str


class ConsoleClient:
    """One browser's worth of console: its own cookies, no redirects followed by itself."""

    def __init__(self, server: RunningServer) -> None:
        self.server = server
        self.jar = aiohttp.CookieJar(unsafe=True)  # cookies of 127.0.0.1
        self.http = aiohttp.ClientSession(cookie_jar=self.jar)
        self.ssl: ssl.SSLContext = client_context(server.ca_pem)

    async def close(self) -> None:
        await self.http.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        data: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        follow: bool = False,
    ) -> Answer:
        async with self.http.request(
            method,
            self.server.url + path,
            data=data,
            headers=headers,
            ssl=self.ssl,
            allow_redirects=follow,
        ) as response:
            return Answer(
                response.status, await response.text(), response.headers, str(response.url)
            )

    async def get(self, path: str, **options: Any) -> Answer:
        return await self.request("GET", path, **options)

    async def post(self, path: str, data: dict[str, str], **options: Any) -> Answer:
        return await self.request("POST", path, data=data, **options)

    async def sign_in(self, token: str) -> Answer:
        """Sign in as a person does: the form, then the token posted with its CSRF token."""
        form = await self.get("/ui/sign-in")
        return await self.post("/ui/sign-in", {"csrf": csrf_of(form.text), "token": token})

    @asynccontextmanager
    async def events(self, path: str) -> AsyncIterator[EventStream]:
        """A console event stream (``/ui/events/...``), open for the block."""
        async with self.http.get(self.server.url + path, ssl=self.ssl) as response:
            assert response.status == 200, await response.text()
            assert response.headers["Content-Type"].startswith("text/event-stream")
            yield EventStream(response)

    async def csrf(self, path: str = "/ui/") -> str:
        return csrf_of((await self.get(path)).text)


async def add_user(server: RunningServer, name: str, *, admin: bool = False) -> str:
    """A new user; their API token."""
    status, answer = await server.api("POST", "/api/v1/users", {"name": name, "admin": admin})
    assert status == 201, answer
    token: str = answer["token"]
    return token


async def grant(server: RunningServer, user: str, cluster: str, **flags: Any) -> None:
    status, answer = await server.api("PUT", f"/api/v1/grants/{user}/{cluster}", flags)
    assert status == 200, answer


class EventStream:
    """The Server-Sent Events of one console stream, read as they come."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response
        self._buffer = b""

    async def next(self) -> tuple[str, Any]:
        """The next event: its name and its data (JSON). Comments are skipped."""
        while True:
            block, found, rest = self._buffer.partition(b"\n\n")
            if not found:
                chunk = await self.response.content.readany()
                if not chunk:
                    raise AssertionError("the event stream ended")
                self._buffer += chunk
                continue
            self._buffer = rest
            name, data = "message", ""
            for line in block.decode().split("\n"):
                if line.startswith("event: "):
                    name = line[len("event: ") :]
                elif line.startswith("data: "):
                    data = line[len("data: ") :]
            if data:
                return name, json.loads(data)

    async def until(self, name: str, accept: Callable[[Any], bool] = lambda data: True) -> Any:
        """The data of the next ``name`` event that ``accept`` takes."""
        while True:
            event, data = await self.next()
            if event == name and accept(data):
                return data
