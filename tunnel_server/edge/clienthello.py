"""How many bytes a TLS ClientHello needs, judged from the first bytes a client sent.

The listener gives a connection a handshake slot only once its whole
ClientHello is in (:mod:`tunnel_server.edge.handshakes`), and closes at once a
connection whose first bytes are no ClientHello. This reads no further than
the record layer and the handshake message's header (RFC 8446, 5.1 and 4);
OpenSSL reads the rest.
"""

from __future__ import annotations

__all__ = ["MAX_CLIENT_HELLO_BYTES", "MAX_RECORD", "RECORD_HEADER", "client_hello_needs"]

#: A record's header: content type, legacy version (3, x), length.
RECORD_HEADER = 5
#: A handshake message's header: type, length (three bytes).
HANDSHAKE_HEADER = 4
HANDSHAKE_RECORD = 22
CLIENT_HELLO = 1
#: The most plaintext a record may hold (2^14 bytes).
MAX_RECORD = 2**14
#: The fewest bytes of a ClientHello's body: version, random, and one byte or
#: two for each of the session id, cipher suites and compression methods.
MIN_CLIENT_HELLO_BODY = 2 + 32 + 1 + 2 + 2 + 1 + 1
#: The most bytes, records included, waited for: a ClientHello is about 2 KiB
#: even with a post-quantum key share; one claiming more is refused.
MAX_CLIENT_HELLO_BYTES = 64 * 1024


def client_hello_needs(head: bytes) -> int | None:
    """The bytes the ClientHello that ``head`` begins needs in all, as far as ``head`` tells.

    More than ``len(head)`` while it is incomplete (ask again with at least
    that many); at most ``len(head)`` once it is whole; None when ``head`` is
    not the start of a ClientHello of at most :data:`MAX_CLIENT_HELLO_BYTES`. A ClientHello may come
    in several records, and its header may be split between them.
    """
    offset = 0
    header = b""
    body = -1  # the message's length, once its header is known
    payload = 0
    while True:
        if offset + RECORD_HEADER > MAX_CLIENT_HELLO_BYTES:
            return None
        if len(head) < offset + RECORD_HEADER:
            return offset + RECORD_HEADER
        if head[offset] != HANDSHAKE_RECORD or head[offset + 1] != 3:
            return None
        length = int.from_bytes(head[offset + 3 : offset + 5], "big")
        end = offset + RECORD_HEADER + length
        if not 0 < length <= MAX_RECORD or end > MAX_CLIENT_HELLO_BYTES:
            return None
        if body < 0:
            header += head[offset + RECORD_HEADER : end][: HANDSHAKE_HEADER - len(header)]
            if len(header) == HANDSHAKE_HEADER:
                body = int.from_bytes(header[1:], "big")
                most = MAX_CLIENT_HELLO_BYTES - RECORD_HEADER - HANDSHAKE_HEADER
                if header[0] != CLIENT_HELLO or not MIN_CLIENT_HELLO_BODY <= body <= most:
                    return None
            elif len(head) < end:
                return end  # the header's rest is in this record
        payload += length
        if body >= 0 and payload >= HANDSHAKE_HEADER + body:
            return end
        offset = end
