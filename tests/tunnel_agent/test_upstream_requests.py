"""The agent's HTTP/1.1 client to the API server: request bodies, refusals, connecting (TLS)."""

from __future__ import annotations

import asyncio
import socket
import ssl
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from kubernetes_asyncio import client as kube_client

from tunnel_agent.kubeapi import KubeApi
from tunnel_agent.upstream import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamRequestError,
)
from tunnel_pki.ca import CertificateAuthority
from tunnel_pki.csr import make_csr
from tunnel_pki.keys import generate_private_key, private_key_to_pem
from tunnel_pki.tls import client_context, server_context

from ..support import until
from .upstream_origin import (
    Exchange,
    body_of,
    ok,
    pool_for,
    read_all,
    response_bytes,
    running,
)

# Request bodies ---------------------------------------------------------------------------


async def echo(exchange: Exchange) -> None:
    exchange.write(response_bytes(b"%d bytes" % len(exchange.body)))


async def test_body_with_content_length_arrives_intact() -> None:
    chunks = [bytes([n]) * 70_000 for n in range(20)]
    total = sum(map(len, chunks))
    async with running(echo) as origin, pool_for(origin.url) as pool:
        response = await pool.request(
            "PUT", "/a", [("content-length", str(total))], body_of(*chunks)
        )
        with response:
            assert await response.read() == b"%d bytes" % total
        [exchange] = origin.exchanges
        assert exchange.body == b"".join(chunks)
        assert exchange.header("content-length") == str(total)
        assert exchange.header("transfer-encoding") is None
        assert pool.idle_connections == 1


async def test_body_without_length_is_sent_chunked_and_arrives_intact() -> None:
    chunks = [b"first,", b"second," * 10_000, b"third"]
    async with running(echo) as origin, pool_for(origin.url) as pool:
        response = await pool.request("POST", "/a", [], body_of(*chunks))
        with response:
            assert await response.read() == b"%d bytes" % len(b"".join(chunks))
        [exchange] = origin.exchanges
        assert exchange.header("transfer-encoding") == "chunked"
        assert exchange.body == b"".join(chunks)
        assert pool.idle_connections == 1


async def test_the_same_headers_go_with_or_without_a_body_as_each_request_needs() -> None:
    headers = [("accept", "application/json"), ("x-caller", "same")]
    async with running(echo) as origin, pool_for(origin.url) as pool:
        for method, body in (("GET", None), ("POST", body_of(b"abc")), ("GET", None)):
            with await pool.request(method, "/a", headers, body) as response:
                await response.read()
        plain, posted, plain_again = origin.exchanges
        assert [e.header("transfer-encoding") for e in (plain, posted, plain_again)] == [
            None,
            "chunked",
            None,
        ]
        assert posted.body == b"abc"
        assert all(e.header("x-caller") == "same" for e in (plain, posted, plain_again))


async def test_the_clients_own_credential_goes_per_request_and_follows_a_rotation() -> None:
    headers = [("accept", "application/json")]
    async with running(echo) as origin, pool_for(origin.url) as pool:
        for token in ("Bearer first", "Bearer rotated"):
            with await pool.request("GET", "/a", headers, authorization=token) as response:
                await response.read()
        with pytest.raises(UpstreamRequestError, match="own Authorization"):
            await pool.request("GET", "/a", headers, authorization="Bearer x\r\ny: z")
        first, second = origin.exchanges
        assert (first.header("authorization"), second.header("authorization")) == (
            "Bearer first",
            "Bearer rotated",
        )
        assert second.header("accept") == "application/json"


async def test_body_shorter_than_its_content_length_fails_and_closes_the_connection() -> None:
    async with running(echo) as origin, pool_for(origin.url) as pool:
        with pytest.raises(UpstreamRequestError, match="ended after 5 of its 10 bytes"):
            await pool.request("POST", "/a", [("content-length", "10")], body_of(b"short"))
        await until(lambda: bool(origin.peers) and origin.peers[0].client_left.is_set())
        assert origin.exchanges == []
        assert pool.open_connections == 0


async def test_body_longer_than_its_content_length_is_refused() -> None:
    async def wait_for_more(exchange: Exchange) -> None:
        # The origin has its 4 bytes (if the client's abort let them through);
        # it answers only once the client is gone.
        if not await exchange.reader.read(1):
            exchange.peer.client_left.set()
        exchange.keep = False

    async with running(wait_for_more) as origin, pool_for(origin.url) as pool:
        with pytest.raises(UpstreamRequestError, match="longer than its content-length"):
            await pool.request("POST", "/a", [("content-length", "4")], body_of(b"data", b"more"))
        await until(lambda: bool(origin.peers) and origin.peers[0].client_left.is_set())
        assert all(exchange.body == b"data" for exchange in origin.exchanges)
        assert pool.open_connections == 0


async def test_a_length_without_a_body_is_refused_before_sending() -> None:
    async with running(echo) as origin, pool_for(origin.url) as pool:
        with pytest.raises(UpstreamRequestError, match="carries none"):
            await pool.request("POST", "/a", [("content-length", "3")])
        assert origin.peers == []


# Refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "headers", "match"),
    [
        ("GET", "/a", [("x-note", "one\r\nimpersonate-user: system:admin")], "x-note header"),
        ("GET", "/a", [("x-note", "one\nx: y")], "control character"),
        ("GET", "/a", [("x-note", "nul\x00")], "control character"),
        ("GET", "/a", [("x-evil\r\nx", "v")], "header name"),
        ("GET", "/a", [("x evil", "v")], "header name"),
        ("GET", "/a HTTP/1.1\r\nx: y", [], "path"),
        ("GET", "/a\tb", [], "path"),
        ("GET", "/a\x85", [], "path"),
        ("GET /x", "/a", [], "method"),
        ("GET", "/a", [("content-length", "1e3")], "content-length"),
        ("GET", "/a", [("content-length", "1"), ("content-length", "1")], "content-length"),
    ],
)
async def test_unsafe_requests_are_refused_before_anything_is_sent(
    method: str, path: str, headers: list[tuple[str, str]], match: str
) -> None:
    async with running(ok) as origin, pool_for(origin.url) as pool:
        with pytest.raises(UpstreamRequestError, match=match) as raised:
            await pool.request(method, path, headers, body_of(b"x"))
        assert "system:admin" not in str(raised.value)
        assert origin.peers == []


async def test_values_never_appear_in_errors() -> None:
    async with running(ok) as origin, pool_for(origin.url) as pool:
        with pytest.raises(UpstreamRequestError) as raised:
            await pool.request("GET", "/a", [("authorization", "Bearer secret-token\r\n")])
        assert "secret-token" not in str(raised.value)
        assert "authorization" in str(raised.value)
        assert origin.peers == []


async def test_head_requests_are_not_for_this_client() -> None:
    async with running(ok) as origin, pool_for(origin.url) as pool:
        with pytest.raises(ValueError, match="HEAD"):
            await pool.request("HEAD", "/a", [])
        assert origin.peers == []


async def test_an_oversize_response_head_is_refused() -> None:
    async def huge_head(exchange: Exchange) -> None:
        headers = [f"X-Filler-{n}: {'v' * 10_000}" for n in range(4)]
        exchange.write(response_bytes(b"body", *headers))

    async with running(huge_head) as origin, pool_for(origin.url) as pool:
        with pytest.raises(UpstreamError, match="head is over"):
            await pool.request("GET", "/a", [])
        assert pool.open_connections == 0


async def test_an_endless_response_head_is_refused_before_it_ends() -> None:
    async def endless_head(exchange: Exchange) -> None:
        exchange.write(b"HTTP/1.1 200 OK\r\nX-Endless: ")
        while not exchange.peer.client_left.is_set():
            exchange.write(b"v" * 65536)
            try:
                await exchange.peer.writer.drain()
            except ConnectionError:
                exchange.peer.client_left.set()
        exchange.keep = False

    async with running(endless_head) as origin, pool_for(origin.url) as pool:
        with pytest.raises(UpstreamError, match="head is over"):
            await pool.request("GET", "/a", [])
        await origin.peers[0].client_left.wait()


async def test_too_many_response_headers_are_refused() -> None:
    async def many(exchange: Exchange) -> None:
        exchange.write(response_bytes(b"", *(f"X-H{n}: v" for n in range(200))))

    async with running(many) as origin, pool_for(origin.url) as pool:
        with pytest.raises(UpstreamError, match="more than 128 headers"):
            await pool.request("GET", "/a", [])


async def test_an_invalid_answer_is_an_upstream_error() -> None:
    async def garbage(exchange: Exchange) -> None:
        exchange.write(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")

    async with running(garbage) as origin, pool_for(origin.url) as pool:
        with pytest.raises(UpstreamError, match="not valid HTTP"):
            await pool.request("GET", "/a", [])


async def test_an_unasked_protocol_switch_is_refused() -> None:
    async def switch(exchange: Exchange) -> None:
        exchange.write(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n"
        )

    async with running(switch) as origin, pool_for(origin.url) as pool:
        with pytest.raises(UpstreamError, match="switched protocols"):
            await pool.request("GET", "/a", [])


# Connecting -------------------------------------------------------------------------------


async def test_a_refused_connection_is_an_upstream_connect_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with pool_for(f"http://127.0.0.1:{port}") as pool:
        with pytest.raises(UpstreamConnectError, match=f"127.0.0.1:{port}"):
            await pool.request("GET", "/a", [])


async def test_a_server_that_never_finishes_the_handshake_times_out() -> None:
    accepted = asyncio.Event()
    left = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set()
        await reader.read()  # a TLS ClientHello, never answered; then the client gives up
        writer.close()
        left.set()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with pool_for(f"https://127.0.0.1:{port}", connect_timeout=0.2) as pool:
            with pytest.raises(UpstreamConnectError, match=r"within 0\.2 s"):
                await pool.request("GET", "/a", [])
        assert accepted.is_set()
        await left.wait()
    finally:
        server.close()
        await server.wait_closed()


def make_pki() -> tuple[CertificateAuthority, ssl.SSLContext]:
    """A CA, and a server context for 127.0.0.1 that requires a client certificate of it."""
    ca = CertificateAuthority.create("test API server CA")
    issued = ca.issue_server_certificate(["127.0.0.1"], timedelta(days=1))
    assert issued.key_pem is not None
    return ca, server_context(
        issued.cert_pem, issued.key_pem, ca.cert_pem, require_client_cert=True
    )


def kube_api_with_client_certificate(url: str, ca: CertificateAuthority, tmp_path: Path) -> KubeApi:
    """A KubeApi as a kubeconfig with a client certificate makes it."""
    key = generate_private_key()
    issued = ca.sign_client_csr(
        make_csr(key, "agent"), "agent", timedelta(days=1), datetime.now(UTC)
    )
    (tmp_path / "ca.pem").write_bytes(ca.cert_pem)
    (tmp_path / "client.pem").write_bytes(issued.cert_pem)
    (tmp_path / "client-key.pem").write_bytes(private_key_to_pem(key))
    configuration = kube_client.Configuration(host=url)
    configuration.ssl_ca_cert = str(tmp_path / "ca.pem")
    configuration.cert_file = str(tmp_path / "client.pem")
    configuration.key_file = str(tmp_path / "client-key.pem")
    return KubeApi(configuration)


async def test_tls_with_the_kube_api_context_presents_the_client_certificate(
    tmp_path: Path,
) -> None:
    ca, context = make_pki()

    async def who(exchange: Exchange) -> None:
        peer = exchange.peer.writer.get_extra_info("peercert")
        subject = dict(pair[0] for pair in peer["subject"])
        exchange.write(response_bytes(subject["commonName"].encode()))

    async with running(who, context) as origin:
        api = kube_api_with_client_certificate(origin.url, ca, tmp_path)
        assert api.base_url.startswith("https://")
        async with pool_for(api.base_url, ssl_context=api.ssl_context) as pool:
            assert await read_all(pool, "GET", "/a") == b"agent"
            assert await read_all(pool, "GET", "/b") == b"agent"
            assert [exchange.peer.number for exchange in origin.exchanges] == [0, 0]
        await api.close()


async def test_tls_to_a_server_of_another_ca_is_refused_as_untrusted(tmp_path: Path) -> None:
    _, context = make_pki()
    other = CertificateAuthority.create("another CA")
    async with running(ok, context) as origin:
        async with pool_for(origin.url, ssl_context=client_context(other.cert_pem)) as pool:
            with pytest.raises(UpstreamConnectError, match="does not trust"):
                await pool.request("GET", "/a", [])
        assert origin.exchanges == []
