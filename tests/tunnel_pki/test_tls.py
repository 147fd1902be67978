"""SSL contexts for the server and the agent (tunnel_pki.tls), in real handshakes.

The loopback tests run an asyncio TLS server and client over real sockets.
The in-memory tests drive both ends through ``ssl.MemoryBIO`` so that the
server's own handshake error can be asserted, which asyncio does not surface.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import stat
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography.x509.oid import NameOID

from tunnel_pki.ca import CertificateAuthority, IssuedCertificate
from tunnel_pki.errors import (
    InvalidCertificateError,
    InvalidKeyError,
    KeyMismatchError,
    TlsContextError,
)
from tunnel_pki.identity import ClientIdentity, verify_client_certificate
from tunnel_pki.tls import client_context, server_context

IssueAgent = Callable[..., tuple[IssuedCertificate, bytes]]
DAY = timedelta(days=1)


@pytest.fixture
def server_cert(ca: CertificateAuthority) -> IssuedCertificate:
    return ca.issue_server_certificate(["localhost", "127.0.0.1", "::1"], DAY)


def _server_context(
    ca: CertificateAuthority, server_cert: IssuedCertificate, *, require: bool = False
) -> ssl.SSLContext:
    assert server_cert.key_pem is not None
    return server_context(
        server_cert.cert_pem, server_cert.key_pem, ca.cert_pem, require_client_cert=require
    )


# --- loopback ---------------------------------------------------------------------------------


@dataclass
class Loopback:
    """A TLS echo of who the client is: 'anonymous' or 'cluster=<name>'."""

    port: int
    identities: list[ClientIdentity | None] = field(default_factory=list)


@asynccontextmanager
async def _serve(context: ssl.SSLContext, ca: CertificateAuthority) -> AsyncIterator[Loopback]:
    loopback = Loopback(port=0)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ssl_object = writer.get_extra_info("ssl_object")
        assert isinstance(ssl_object, ssl.SSLObject)
        der = ssl_object.getpeercert(binary_form=True)
        if der is None:
            loopback.identities.append(None)
            writer.write(b"anonymous\n")
        else:
            # What the server does per request: check the peer certificate itself.
            identity = verify_client_certificate(der, ca.certificate, datetime.now(UTC))
            loopback.identities.append(identity)
            writer.write(f"cluster={identity.cluster}\n".encode())
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=context)
    loopback.port = server.sockets[0].getsockname()[1]
    try:
        yield loopback
    finally:
        server.close()
        await server.wait_closed()


@dataclass(frozen=True)
class Outcome:
    reply: bytes
    version: str | None
    alpn: str | None


async def _connect(port: int, context: ssl.SSLContext, hostname: str = "localhost") -> Outcome:
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname=hostname
    )
    try:
        ssl_object = writer.get_extra_info("ssl_object")
        assert isinstance(ssl_object, ssl.SSLObject)
        reply = await reader.read()
        return Outcome(reply, ssl_object.version(), ssl_object.selected_alpn_protocol())
    finally:
        writer.close()
        # The server may have dropped the connection; that is what some tests prove.
        with contextlib.suppress(ssl.SSLError, ConnectionError):
            await writer.wait_closed()


async def _refused(port: int, context: ssl.SSLContext) -> None:
    """Assert that the server refuses the connection and the client learns nothing.

    With TLS 1.2 the client's own handshake fails; with TLS 1.3 the client
    finishes first and the server, failing its side, closes the connection.
    """
    try:
        outcome = await _connect(port, context)
    except (ssl.SSLError, ConnectionError):
        return
    assert outcome.reply == b""


@pytest.mark.parametrize("hostname", ["localhost", "127.0.0.1"])
async def test_server_certificate_verifies_in_a_real_handshake(
    ca: CertificateAuthority, server_cert: IssuedCertificate, hostname: str
) -> None:
    async with _serve(_server_context(ca, server_cert), ca) as loopback:
        outcome = await _connect(loopback.port, client_context(ca.cert_pem), hostname)
    assert outcome.reply == b"anonymous\n"
    assert outcome.version == "TLSv1.3"
    assert outcome.alpn == "http/1.1"
    assert loopback.identities == [None]


async def test_server_certificate_verifies_over_tls_1_2(
    ca: CertificateAuthority, server_cert: IssuedCertificate
) -> None:
    context = client_context(ca.cert_pem)
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    async with _serve(_server_context(ca, server_cert), ca) as loopback:
        outcome = await _connect(loopback.port, context)
    assert outcome.reply == b"anonymous\n"
    assert outcome.version == "TLSv1.2"


async def test_client_refuses_a_server_from_another_ca(
    ca: CertificateAuthority, other_ca: CertificateAuthority, server_cert: IssuedCertificate
) -> None:
    async with _serve(_server_context(ca, server_cert), ca) as loopback:
        with pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"):
            await _connect(loopback.port, client_context(other_ca.cert_pem))
    assert loopback.identities == []


async def test_client_refuses_a_server_certificate_for_another_host(
    ca: CertificateAuthority, server_cert: IssuedCertificate
) -> None:
    async with _serve(_server_context(ca, server_cert), ca) as loopback:
        with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
            await _connect(loopback.port, client_context(ca.cert_pem), "tunnel.example.com")


async def test_mtls_server_sees_the_cluster_of_the_client_certificate(
    ca: CertificateAuthority, server_cert: IssuedCertificate, issue_agent: IssueAgent
) -> None:
    issued, key_pem = issue_agent(ca, "prod-eu-1")
    context = client_context(ca.cert_pem, cert_pem=issued.cert_pem, key_pem=key_pem)
    async with _serve(_server_context(ca, server_cert), ca) as loopback:
        outcome = await _connect(loopback.port, context)
    assert outcome.reply == b"cluster=prod-eu-1\n"
    [identity] = loopback.identities
    assert identity is not None
    assert identity.fingerprint == issued.fingerprint


async def test_mtls_succeeds_when_client_certificates_are_required(
    ca: CertificateAuthority, server_cert: IssuedCertificate, issue_agent: IssueAgent
) -> None:
    issued, key_pem = issue_agent(ca, "prod")
    context = client_context(ca.cert_pem, cert_pem=issued.cert_pem, key_pem=key_pem)
    async with _serve(_server_context(ca, server_cert, require=True), ca) as loopback:
        outcome = await _connect(loopback.port, context)
    assert outcome.reply == b"cluster=prod\n"


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_2])
async def test_mtls_refuses_a_client_certificate_from_another_ca(
    ca: CertificateAuthority,
    other_ca: CertificateAuthority,
    server_cert: IssuedCertificate,
    issue_agent: IssueAgent,
    version: ssl.TLSVersion,
) -> None:
    issued, key_pem = issue_agent(other_ca, "prod")
    context = client_context(ca.cert_pem, cert_pem=issued.cert_pem, key_pem=key_pem)
    context.maximum_version = version
    async with _serve(_server_context(ca, server_cert), ca) as loopback:
        await _refused(loopback.port, context)
    assert loopback.identities == []


async def test_required_client_certificate_refuses_a_client_without_one(
    ca: CertificateAuthority, server_cert: IssuedCertificate
) -> None:
    async with _serve(_server_context(ca, server_cert, require=True), ca) as loopback:
        await _refused(loopback.port, client_context(ca.cert_pem))
    assert loopback.identities == []


# --- in memory: the server's side of the handshake --------------------------------------------


def _handshake(
    client: ssl.SSLContext, server: ssl.SSLContext, hostname: str = "localhost"
) -> tuple[ssl.SSLObject, ssl.SSLObject]:
    """Run a handshake between the two contexts through memory BIOs; errors propagate."""
    to_server, from_client, to_client, from_server = (ssl.MemoryBIO() for _ in range(4))
    client_end = client.wrap_bio(to_client, from_client, server_hostname=hostname)
    server_end = server.wrap_bio(to_server, from_server, server_side=True)
    client_done = server_done = False
    for _ in range(8):
        if not client_done:
            try:
                client_end.do_handshake()
                client_done = True
            except ssl.SSLWantReadError:
                pass
        to_server.write(from_client.read())
        if not server_done:
            try:
                server_end.do_handshake()
                server_done = True
            except ssl.SSLWantReadError:
                pass
        to_client.write(from_server.read())
        if client_done and server_done:
            return client_end, server_end
    raise AssertionError("the handshake did not finish")


def test_server_handshake_fails_verifying_a_client_certificate_from_another_ca(
    ca: CertificateAuthority,
    other_ca: CertificateAuthority,
    server_cert: IssuedCertificate,
    issue_agent: IssueAgent,
) -> None:
    issued, key_pem = issue_agent(other_ca, "prod")
    client = client_context(ca.cert_pem, cert_pem=issued.cert_pem, key_pem=key_pem)
    with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer"):
        _handshake(client, _server_context(ca, server_cert))


def test_server_handshake_fails_on_an_expired_client_certificate(
    ca: CertificateAuthority, server_cert: IssuedCertificate, issue_agent: IssueAgent
) -> None:
    past = datetime.now(UTC) - timedelta(days=2)
    issued, key_pem = issue_agent(ca, "prod", lifetime=timedelta(hours=1), at=past)
    client = client_context(ca.cert_pem, cert_pem=issued.cert_pem, key_pem=key_pem)
    with pytest.raises(ssl.SSLCertVerificationError, match="certificate has expired"):
        _handshake(client, _server_context(ca, server_cert))


def test_server_handshake_without_client_certificate_is_allowed_by_default(
    ca: CertificateAuthority, server_cert: IssuedCertificate
) -> None:
    _, server_end = _handshake(client_context(ca.cert_pem), _server_context(ca, server_cert))
    assert server_end.getpeercert(binary_form=True) is None


def test_server_handshake_requires_a_client_certificate_when_asked(
    ca: CertificateAuthority, server_cert: IssuedCertificate
) -> None:
    with pytest.raises(ssl.SSLError, match="PEER_DID_NOT_RETURN_A_CERTIFICATE"):
        _handshake(client_context(ca.cert_pem), _server_context(ca, server_cert, require=True))


@pytest.mark.parametrize(
    ("offered", "selected"),
    [(["h2", "http/1.1"], "http/1.1"), (["h2"], None), (["http/1.1"], "http/1.1")],
)
def test_server_never_selects_h2(
    ca: CertificateAuthority,
    server_cert: IssuedCertificate,
    offered: list[str],
    selected: str | None,
) -> None:
    client = client_context(ca.cert_pem)
    client.set_alpn_protocols(offered)
    client_end, _ = _handshake(client, _server_context(ca, server_cert))
    assert client_end.selected_alpn_protocol() == selected


# --- context settings -------------------------------------------------------------------------


def test_server_context_settings(ca: CertificateAuthority, server_cert: IssuedCertificate) -> None:
    optional = _server_context(ca, server_cert)
    assert optional.verify_mode == ssl.CERT_OPTIONAL
    assert optional.minimum_version == ssl.TLSVersion.TLSv1_2
    assert optional.options & ssl.OP_NO_RENEGOTIATION
    assert [c["subject"] for c in optional.get_ca_certs()] == [
        c["subject"] for c in client_context(ca.cert_pem).get_ca_certs()
    ]
    assert _server_context(ca, server_cert, require=True).verify_mode == ssl.CERT_REQUIRED


def test_client_context_pins_the_given_ca_only(ca: CertificateAuthority) -> None:
    context = client_context(ca.cert_pem)
    assert context.check_hostname is True
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    [only] = context.get_ca_certs()
    [name] = ca.certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    assert only["subject"] == ((("commonName", name.value),),)


def test_client_context_needs_both_certificate_and_key(
    ca: CertificateAuthority, issue_agent: IssueAgent
) -> None:
    issued, key_pem = issue_agent(ca)
    with pytest.raises(TlsContextError, match="both"):
        client_context(ca.cert_pem, cert_pem=issued.cert_pem)
    with pytest.raises(TlsContextError, match="both"):
        client_context(ca.cert_pem, key_pem=key_pem)


def test_contexts_refuse_a_key_that_does_not_match_the_certificate(
    ca: CertificateAuthority, server_cert: IssuedCertificate, issue_agent: IssueAgent
) -> None:
    _, other_key = issue_agent(ca)
    with pytest.raises(KeyMismatchError):
        server_context(server_cert.cert_pem, other_key, ca.cert_pem)
    with pytest.raises(KeyMismatchError):
        client_context(ca.cert_pem, cert_pem=server_cert.cert_pem, key_pem=other_key)


def test_contexts_refuse_garbage_with_typed_errors(
    ca: CertificateAuthority, server_cert: IssuedCertificate
) -> None:
    assert server_cert.key_pem is not None
    with pytest.raises(InvalidCertificateError):
        server_context(b"garbage", server_cert.key_pem, ca.cert_pem)
    with pytest.raises(InvalidKeyError):
        server_context(server_cert.cert_pem, b"garbage", ca.cert_pem)
    with pytest.raises(InvalidCertificateError):
        server_context(server_cert.cert_pem, server_cert.key_pem, b"garbage")
    with pytest.raises(InvalidCertificateError):
        client_context(b"")


def test_key_goes_to_openssl_encrypted_in_private_temporary_files(
    ca: CertificateAuthority,
    server_cert: IssuedCertificate,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    seen: list[tuple[int, int, int, bytes]] = []
    original = ssl.SSLContext.load_cert_chain

    def spy(
        self: ssl.SSLContext, certfile: str, keyfile: str | None = None, password: object = None
    ) -> None:
        assert keyfile is not None
        directory = os.path.dirname(keyfile)
        seen.append(
            (
                stat.S_IMODE(os.stat(directory).st_mode),
                stat.S_IMODE(os.stat(certfile).st_mode),
                stat.S_IMODE(os.stat(keyfile).st_mode),
                Path(keyfile).read_bytes(),
            )
        )
        original(self, certfile, keyfile, password)  # type: ignore[arg-type]

    monkeypatch.setattr(ssl.SSLContext, "load_cert_chain", spy)
    _server_context(ca, server_cert)
    [(directory_mode, cert_mode, key_mode, key_file)] = seen
    assert (directory_mode, cert_mode, key_mode) == (0o700, 0o600, 0o600)
    assert key_file.startswith(b"-----BEGIN ENCRYPTED PRIVATE KEY-----")
    assert list(tmp_path.iterdir()) == []
