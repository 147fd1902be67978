"""The agent's HTTP/1.1 client to the API server: connections and response bodies."""

from __future__ import annotations

import asyncio
import gzip

import pytest

from tunnel_agent.upstream import (
    HIGH_WATER_BYTES,
    UpstreamError,
    UpstreamPool,
)

from ..support import assert_tcp_keepalive, until
from .upstream_origin import (
    Exchange,
    body_of,
    first_answered_only,
    ok,
    pool_for,
    read_all,
    response_bytes,
    running,
)

# Connections ------------------------------------------------------------------------------


async def test_the_next_request_reuses_the_same_connection() -> None:
    async with running(ok) as origin, pool_for(origin.url) as pool:
        assert await read_all(pool, "GET", "/api/v1/pods") == b"GET /api/v1/pods"
        assert await read_all(pool, "GET", "/api/v1/nodes?limit=1") == b"GET /api/v1/nodes?limit=1"
        assert [exchange.peer.number for exchange in origin.exchanges] == [0, 0]
        assert len(origin.peers) == 1
        assert pool.idle_connections == 1


async def test_a_connection_to_the_api_server_has_tcp_keepalive() -> None:
    # An API server whose node died sends no FIN: a quiet watch or logs -f
    # through this connection would otherwise wait for ever (tcp_keepalive.py).
    async with running(ok) as origin, pool_for(origin.url) as pool:
        assert await read_all(pool, "GET", "/api/v1/pods") == b"GET /api/v1/pods"
        [connection] = pool._idle
        assert connection.transport is not None
        sock = connection.transport.get_extra_info("socket")
        assert_tcp_keepalive(sock)


async def test_host_header_and_path_prefix_come_from_the_base_url() -> None:
    async with running(ok) as origin, pool_for(origin.url + "/k8s/clusters/x/") as pool:
        await read_all(pool, "GET", "/api/v1/pods?watch=1")
        [exchange] = origin.exchanges
        assert exchange.target == "/k8s/clusters/x/api/v1/pods?watch=1"
        assert exchange.header("host") == f"127.0.0.1:{origin.port}"


async def test_framing_headers_given_by_the_caller_are_replaced_by_the_clients_own() -> None:
    async with running(ok) as origin, pool_for(origin.url) as pool:
        response = await pool.request(
            "GET",
            "/api",
            [("host", "evil.example"), ("connection", "close"), ("x-kept", "yes")],
        )
        response.close()
        [exchange] = origin.exchanges
        assert [name for name, _ in exchange.headers].count("host") == 1
        assert exchange.header("host") == f"127.0.0.1:{origin.port}"
        assert exchange.header("connection") is None
        assert exchange.header("x-kept") == "yes"


async def test_an_answer_with_connection_close_is_not_reused() -> None:
    async def closing(exchange: Exchange) -> None:
        exchange.write(response_bytes(b"bye", "Connection: close"))
        exchange.keep = False

    async with running(closing) as origin, pool_for(origin.url) as pool:
        assert await read_all(pool, "GET", "/a") == b"bye"
        assert await read_all(pool, "GET", "/b") == b"bye"
        assert [exchange.peer.number for exchange in origin.exchanges] == [0, 1]


async def test_idle_connections_beyond_the_bound_are_closed() -> None:
    async with running(ok) as origin, pool_for(origin.url, max_idle=1) as pool:
        first = await pool.request("GET", "/a", [])
        second = await pool.request("GET", "/b", [])
        for response in (first, second):
            with response:
                assert await response.read()
                assert await response.read() == b""
        assert pool.idle_connections == 1
        # The one given back second found the pool full: the origin sees it leave.
        await origin.peers[1].client_left.wait()
        assert not origin.peers[0].client_left.is_set()


async def test_a_connection_the_server_closed_while_idle_is_not_used() -> None:
    async with running(ok) as origin, pool_for(origin.url) as pool:
        await read_all(pool, "GET", "/a")
        origin.peers[0].writer.close()
        await until(lambda: pool.open_connections == 0)
        assert pool.idle_connections == 0
        assert await read_all(pool, "GET", "/b") == b"GET /b"
        assert [exchange.peer.number for exchange in origin.exchanges] == [0, 1]


async def test_a_stale_pooled_connection_is_retried_once_on_a_fresh_one() -> None:
    """The server closes a kept connection as the next request arrives: no byte answered."""

    async def close_kept_ones(exchange: Exchange) -> None:
        if exchange.peer.number == 0 and len(origin.exchanges) == 2:
            exchange.keep = False
            return
        await ok(exchange)

    async with running(close_kept_ones) as origin, pool_for(origin.url) as pool:
        assert await read_all(pool, "GET", "/a") == b"GET /a"
        assert await read_all(pool, "GET", "/b") == b"GET /b"
        assert [(e.peer.number, e.target) for e in origin.exchanges] == [
            (0, "/a"),
            (0, "/b"),
            (1, "/b"),
        ]


async def test_a_request_is_retried_once_only() -> None:
    async with running(first_answered_only()) as origin, pool_for(origin.url) as pool:
        await read_all(pool, "GET", "/a")
        with pytest.raises(UpstreamError, match="closed the connection without answering"):
            await pool.request("GET", "/b", [])
        assert [(e.peer.number, e.target) for e in origin.exchanges] == [
            (0, "/a"),
            (0, "/b"),
            (1, "/b"),
        ]


async def test_a_stale_connection_is_not_retried_once_body_bytes_were_read() -> None:
    async with running(first_answered_only()) as origin, pool_for(origin.url) as pool:
        await read_all(pool, "GET", "/a")
        with pytest.raises(UpstreamError, match="without answering"):
            await pool.request("POST", "/b", [("content-length", "4")], body_of(b"data"))
        assert [(e.peer.number, e.target, e.body) for e in origin.exchanges] == [
            (0, "/a", b""),
            (0, "/b", b"data"),
        ]


@pytest.mark.parametrize("method", ["POST", "DELETE", "PATCH"])
async def test_a_stale_connection_is_not_retried_for_a_request_that_is_not_idempotent(
    method: str,
) -> None:
    """Without a body the API server may have acted on it before it closed."""

    async with running(first_answered_only()) as origin, pool_for(origin.url) as pool:
        await read_all(pool, "GET", "/a")
        with pytest.raises(UpstreamError, match="without answering"):
            await pool.request(method, "/b", [])
        assert [(e.peer.number, e.target) for e in origin.exchanges] == [(0, "/a"), (0, "/b")]


async def test_a_stale_connection_is_not_retried_once_an_empty_chunked_body_was_ended() -> None:
    async with running(first_answered_only()) as origin, pool_for(origin.url) as pool:
        await read_all(pool, "GET", "/a")
        with pytest.raises(UpstreamError, match="without answering"):
            await pool.request("POST", "/b", [], body_of())
        assert [(e.peer.number, e.target) for e in origin.exchanges] == [(0, "/a"), (0, "/b")]


async def test_a_reason_phrase_split_across_reads_is_kept_whole() -> None:
    async def split_status_line(exchange: Exchange) -> None:
        exchange.write(b"HTTP/1.1 200 Al")
        await exchange.peer.writer.drain()
        await until(lambda: pool.open_connections == 1 and first_part_read(), max_turns=10**6)
        exchange.write(b"l Good\r\nContent-Length: 0\r\n\r\n")

    def first_part_read() -> bool:
        return any(c.received for c in pool._open)  # the first piece reached the parser

    async with running(split_status_line) as origin, pool_for(origin.url) as pool:
        response = await pool.request("GET", "/a", [])
        with response:
            assert (response.status, response.reason) == (200, "All Good")
        assert len(origin.exchanges) == 1


async def test_pool_close_closes_idle_connections_and_refuses_new_requests() -> None:
    async with running(ok) as origin:
        pool = UpstreamPool(origin.url)
        await read_all(pool, "GET", "/a")
        await pool.close()
        await origin.peers[0].client_left.wait()
        assert pool.open_connections == 0
        with pytest.raises(UpstreamError, match="stopping"):
            await pool.request("GET", "/b", [])


# Response bodies --------------------------------------------------------------------------


async def test_content_length_body_is_read_whole() -> None:
    body = bytes(range(256)) * 1000

    async def big(exchange: Exchange) -> None:
        exchange.write(response_bytes(body, "Content-Type: application/octet-stream"))

    async with running(big) as origin, pool_for(origin.url) as pool:
        response = await pool.request("GET", "/blob", [])
        with response:
            assert (response.status, response.reason) == (200, "OK")
            assert ("content-type", "application/octet-stream") in response.headers
            parts = []
            while chunk := await response.read():
                parts.append(chunk)
        assert b"".join(parts) == body
        assert pool.idle_connections == 1


async def test_chunked_body_arrives_chunk_by_chunk() -> None:
    lines: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def watch(exchange: Exchange) -> None:
        exchange.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        while (line := await lines.get()) is not None:
            exchange.write(b"%x\r\n%s\r\n" % (len(line), line))
        exchange.write(b"0\r\n\r\n")

    async with running(watch) as origin, pool_for(origin.url) as pool:
        response = await pool.request("GET", "/api/v1/pods?watch=1", [])
        with response:
            assert ("transfer-encoding", "chunked") in response.headers
            for number in range(3):
                line = b'{"type":"ADDED","n":%d}\n' % number
                await lines.put(line)
                # Each event is handed out before the next exists: nothing waits for the end.
                assert await response.read() == line
            await lines.put(None)
            assert await response.read() == b""
        assert pool.idle_connections == 1


async def test_close_delimited_body_ends_with_the_connection_and_is_not_reused() -> None:
    async def until_close(exchange: Exchange) -> None:
        exchange.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it, ")
        exchange.write(b"until the end")
        exchange.keep = False

    async with running(until_close) as origin, pool_for(origin.url) as pool:
        assert await read_all(pool, "GET", "/a") == b"all of it, until the end"
        assert pool.idle_connections == 0
        assert await read_all(pool, "GET", "/b") == b"all of it, until the end"
        assert [exchange.peer.number for exchange in origin.exchanges] == [0, 1]


async def test_an_answer_cut_short_raises_and_is_not_reused() -> None:
    async def cut(exchange: Exchange) -> None:
        exchange.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")
        exchange.keep = False

    async with running(cut) as origin, pool_for(origin.url) as pool:
        response = await pool.request("GET", "/a", [])
        with response:
            assert await response.read() == b"only this"
            with pytest.raises(UpstreamError, match="before the end of its answer"):
                await response.read()
        assert pool.open_connections == 0


async def test_a_second_answer_to_one_request_closes_the_connection_and_leaves_the_first() -> None:
    async def twice(exchange: Exchange) -> None:
        # One write: the second answer comes in the same read as the first.
        second = response_bytes(b"SECOND", "X-Second: 1")
        exchange.write(response_bytes(b"ok", status="404 Not Found") + second)

    async with running(twice) as origin, pool_for(origin.url) as pool:
        response = await pool.request("GET", "/a", [])
        with response:
            assert (response.status, response.headers) == (404, [("content-length", "2")])
            assert await response.read() == b"ok"
            assert await response.read() == b""
        # Where its answers start is no longer known: the connection is not used again.
        await until(lambda: pool.open_connections == 0)


async def test_a_chunked_answers_trailer_is_not_taken_into_its_head() -> None:
    async def with_trailer(exchange: Exchange) -> None:
        exchange.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        exchange.write(b"2\r\nok\r\n0\r\nX-Trailer: t\r\n\r\n")

    async with running(with_trailer) as origin, pool_for(origin.url) as pool:
        response = await pool.request("GET", "/a", [])
        with response:
            assert await response.read() == b"ok"
            assert await response.read() == b""
        assert response.headers == [("transfer-encoding", "chunked")]
        assert pool.idle_connections == 1


async def test_an_answer_with_a_transfer_coding_besides_chunked_is_refused() -> None:
    async def coded(exchange: Exchange) -> None:
        exchange.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n")
        exchange.write(gzip.compress(b"coded"))
        exchange.keep = False

    async with running(coded) as origin, pool_for(origin.url) as pool:
        # Relayed without the header, its body would reach the caller still coded.
        with pytest.raises(UpstreamError, match="Transfer-Encoding 'gzip': the tunnel relays"):
            await pool.request("GET", "/a", [])
        await until(lambda: pool.open_connections == 0)


async def test_interim_100_continue_is_skipped() -> None:
    async def with_continue(exchange: Exchange) -> None:
        exchange.write(
            b"HTTP/1.1 100 Continue\r\n\r\n" + response_bytes(b"created", status="201 Created")
        )

    async with running(with_continue) as origin, pool_for(origin.url) as pool:
        response = await pool.request("POST", "/a", [("content-length", "2")], body_of(b"{}"))
        with response:
            assert (response.status, response.reason) == (201, "Created")
            assert await response.read() == b"created"


async def test_reading_pauses_while_the_relay_does_not_read_and_resumes_when_it_does() -> None:
    size = 64 * 1024 * 1024
    piece = bytes(range(256)) * 256  # 64 KiB
    written = 0

    async def bulk(exchange: Exchange) -> None:
        nonlocal written
        exchange.write(f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n".encode())
        while written < size:
            exchange.write(piece)
            written += len(piece)
            await exchange.peer.writer.drain()

    async with running(bulk) as origin, pool_for(origin.url) as pool:
        response = await pool.request("GET", "/logs", [])
        with response:
            await until(lambda: response.reading_paused)
            # The socket buffers fill; then the origin's own buffer passes its
            # high-water mark (64 KiB), where its drain() blocks.
            server = origin.peers[0].writer.transport
            await until(lambda: server.get_write_buffer_size() > 64 * 1024)
            assert written < size
            paused_while_blocked = response.reading_paused
            assert paused_while_blocked
            # What waits in the agent stays bounded: the bound and at most one socket read.
            assert response.buffered <= HIGH_WATER_BYTES + 256 * 1024
            received = 0
            while chunk := await response.read():
                assert _matches(chunk, piece, received)
                received += len(chunk)
            assert received == size
            assert not response.reading_paused
        assert pool.idle_connections == 1
        assert len(origin.exchanges) == 1


def _matches(chunk: bytes, piece: bytes, offset: int) -> bool:
    """``chunk`` is what an endless repetition of ``piece`` holds at ``offset``."""
    start = offset % len(piece)
    repeated = piece[start:] + piece * (len(chunk) // len(piece) + 1)
    return chunk == repeated[: len(chunk)]


async def test_cancelling_the_reader_closes_the_connection_at_once() -> None:
    """A caller that leaves a watch ends it at the API server: no wait for its next event."""
    first_sent = asyncio.Event()

    async def endless_watch(exchange: Exchange) -> None:
        exchange.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        first_sent.set()
        # Quiet, as a watch with no events is: only the client's leaving ends it.
        assert await exchange.reader.read(1) == b""
        exchange.peer.client_left.set()
        exchange.keep = False

    async def relay(pool: UpstreamPool, got_first: asyncio.Event) -> None:
        response = await pool.request("GET", "/api/v1/pods?watch=1", [])
        with response:
            assert await response.read() == b"first"
            got_first.set()
            await response.read()
            raise AssertionError("the watch never ends by itself")

    async with running(endless_watch) as origin, pool_for(origin.url) as pool:
        got_first = asyncio.Event()
        task = asyncio.create_task(relay(pool, got_first))
        await got_first.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await origin.peers[0].client_left.wait()
        assert pool.open_connections == 0
        assert pool.idle_connections == 0


async def test_a_response_left_before_its_end_closes_the_connection() -> None:
    async def big(exchange: Exchange) -> None:
        exchange.write(response_bytes(b"x" * 1_000_000))

    async with running(big) as origin, pool_for(origin.url) as pool:
        response = await pool.request("GET", "/a", [])
        with response:
            assert await response.read()
        await origin.peers[0].client_left.wait()
        assert pool.idle_connections == 0
