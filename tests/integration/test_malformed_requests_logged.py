"""A request aiohttp cannot parse is refused with 400 and logged as one INFO line.

Found in review: a malformed chunked body from a client with no token logged
an ERROR with a traceback, so anyone could fill the server's log with them.
The lean front door logs its refusals as one INFO line with the reason; the
connections it hands to aiohttp now do the same.
"""

from __future__ import annotations

import logging

import pytest

from tunnel_server.edge.parse_errors import ParseErrorLogger

from ..tunnel_server.frontdoor_support import PODS, caller, request
from .harness import RunningServer

MALFORMED = {
    "chunk size": request("POST", PODS, None, "Transfer-Encoding: chunked")
    + b"zz\r\nhello\r\n0\r\n\r\n",
    "chunk end": request("POST", PODS, None, "Transfer-Encoding: chunked") + b"5\r\nhelloXX",
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
async def test_a_malformed_body_from_an_unauthenticated_client_is_one_info_line(
    server: RunningServer, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    caplog.set_level(logging.INFO)
    async with caller(server) as connection:
        connection.send(MALFORMED[case])
        answer = await connection.reader.read()
    assert answer.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request")
    aiohttp = [record for record in caplog.records if record.name == "aiohttp.server"]
    assert [record.levelno for record in aiohttp] == [logging.INFO]
    assert aiohttp[0].exc_info is None
    assert aiohttp[0].getMessage().startswith("refused a malformed request (400): ")


async def test_other_errors_aiohttp_logs_keep_their_traceback() -> None:
    """Only parse errors are shortened: a fault of the server's own still says where."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.Logger("tests.parse_errors")  # not registered: nothing outlives the test
    logger.addHandler(Keep())
    try:
        raise RuntimeError("a fault of the server's own")
    except RuntimeError as error:
        ParseErrorLogger(logger).exception("Error handling request from %s", "x", exc_info=error)
    [record] = records
    assert record.levelno == logging.ERROR
    assert record.exc_info is not None
