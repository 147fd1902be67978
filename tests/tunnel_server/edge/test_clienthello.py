"""How much of a ClientHello has come, judged from the first bytes a client sent."""

from __future__ import annotations

import contextlib
import ssl

import pytest

from tunnel_pki.ca import CertificateAuthority
from tunnel_pki.tls import client_context
from tunnel_server.edge.clienthello import MAX_CLIENT_HELLO_BYTES, client_hello_needs

from ...slow_clients import NOT_CLIENT_HELLOS


def record(payload: bytes) -> bytes:
    return b"\x16\x03\x01" + len(payload).to_bytes(2, "big") + payload


@pytest.fixture(scope="module", params=[ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_2])
def hello(request: pytest.FixtureRequest) -> bytes:
    """A real client's ClientHello (TLS 1.3's, and one offering at most TLS 1.2), in one record."""
    context = client_context(CertificateAuthority.create().cert_pem)
    context.maximum_version = request.param
    outgoing = ssl.MemoryBIO()
    tls = context.wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname="127.0.0.1")
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def test_a_whole_client_hello_needs_no_more(hello: bytes) -> None:
    assert client_hello_needs(hello) == len(hello)
    assert client_hello_needs(hello + b"early data") == len(hello)


def test_every_part_of_a_client_hello_asks_for_more(hello: bytes) -> None:
    for end in range(len(hello)):
        needed = client_hello_needs(hello[:end])
        assert needed is not None
        assert end < needed <= len(hello)


@pytest.mark.parametrize("cut", [1, 2, 3, 4, 40])
def test_a_client_hello_split_between_records_is_waited_for_whole(hello: bytes, cut: int) -> None:
    message = hello[5:]
    split = record(message[:cut]) + record(message[cut:])
    assert client_hello_needs(split) == len(split)
    for end in range(len(split)):
        needed = client_hello_needs(split[:end])
        assert needed is not None
        assert end < needed <= len(split)


def test_a_client_hello_in_tiny_records_is_refused_past_the_bound(hello: bytes) -> None:
    message = hello[5:]
    tiny = b"".join(record(message[i : i + 1]) for i in range(len(message)))
    assert client_hello_needs(tiny) == len(tiny)  # about 3 KiB of records: waited for
    claimed = b"\x01" + (MAX_CLIENT_HELLO_BYTES // 2).to_bytes(3, "big")
    assert client_hello_needs(record(claimed) * 3) == 3 * 9 + 5
    one_byte_records = b"".join(record(bytes([b])) for b in claimed) * 4000
    assert client_hello_needs(one_byte_records) is None


@pytest.mark.parametrize("head", NOT_CLIENT_HELLOS.values(), ids=NOT_CLIENT_HELLOS.keys())
def test_what_cannot_begin_a_client_hello_is_told(head: bytes) -> None:
    assert client_hello_needs(head) is None


def test_too_few_bytes_to_judge_ask_for_a_record_header() -> None:
    assert client_hello_needs(b"") == 5
    assert client_hello_needs(b"\x16\x03") == 5
