"""The request body the front door holds for the agent: bounded, and read on when it can be."""

from __future__ import annotations

from tunnel_server.edge.buffers import BODY_HIGH_WATER, RequestBody


class Socket:
    """Stands for the caller's socket: the pauses and resumes it was asked for."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def pause(self) -> None:
        self.calls.append("pause")

    def resume(self) -> None:
        self.calls.append("resume")


def wants_more(body: RequestBody) -> bool:
    """Read anew each time (a property mypy would take as unchanged between two asserts)."""
    return body.wants_more


async def test_a_body_pauses_the_socket_past_its_high_water_and_resumes_it_as_it_is_read() -> None:
    socket = Socket()
    body = RequestBody(3 * BODY_HIGH_WATER, socket.pause, socket.resume)
    assert wants_more(body)  # nothing held yet: the front door reads on for it
    body.feed(bytes(BODY_HIGH_WATER))
    assert socket.calls == []
    assert wants_more(body)
    body.feed(b"x")
    assert socket.calls == ["pause"]
    assert not wants_more(body)  # held past the bound: not read on
    assert len(await body.read()) == BODY_HIGH_WATER
    assert socket.calls == ["pause", "resume"]
    assert wants_more(body)


async def test_a_complete_body_wants_no_more_and_what_follows_it_is_given_back() -> None:
    socket = Socket()
    body = RequestBody(2, socket.pause, socket.resume)
    assert body.feed(b"{}GET / HTTP/1.1") == b"GET / HTTP/1.1"
    assert body.complete
    assert not wants_more(body)
    assert await body.read() == b"{}"
    assert await body.read() == b""
