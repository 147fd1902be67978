"""The lean front end's HTTP/1.1: strict request heads in, safe response heads out."""

from __future__ import annotations

import time

import pytest

from tunnel_server.edge.http1 import (
    CACHED_BLOCK,
    MAX_HEAD,
    MAX_TARGET,
    CallerRequest,
    HeaderBlockCache,
    MalformedRequestError,
    chunk,
    parse_request_head,
    response_head,
)

MAX_HEADER_LINES = 128  # tunnel_server.edge.http1.MAX_HEADER_LINES (not public)


def head(request_line: str, *headers: str) -> bytes:
    """A request head as the front end hands it over: without its final empty line."""
    return "\r\n".join((request_line, *headers)).encode("latin-1")


#: The Host line every HTTP/1.1 request needs, first, as clients send it.
HOST_LINE = "Host: 127.0.0.1"
HOST = ("host", "127.0.0.1")


def parse(
    *headers: str, request_line: str = "GET /k8s/clusters/prod/api HTTP/1.1"
) -> CallerRequest:
    """``headers`` parsed after the request line, and a Host line first unless one is given."""
    if not any(line.lower().startswith("host:") for line in headers):
        headers = (HOST_LINE, *headers)
    return parse_request_head(head(request_line, *headers))


def refusal(raw: bytes) -> MalformedRequestError:
    with pytest.raises(MalformedRequestError) as caught:
        parse_request_head(raw)
    return caught.value


# ------------------------------------------------------------- request line


def test_request_line_gives_method_raw_target_and_version() -> None:
    request = parse(request_line="PATCH /k8s/clusters/prod/api/v1/pods?a=%2F&b HTTP/1.0")
    assert request.method == "PATCH"
    assert request.target == "/k8s/clusters/prod/api/v1/pods?a=%2F&b"  # raw, not decoded
    assert request.minor_version == 0
    assert parse().minor_version == 1


def test_a_head_of_only_the_request_line_has_no_headers_and_no_body() -> None:
    request = parse_request_head(head("GET /k8s/clusters/prod/api HTTP/1.0"))
    assert request.headers == ()
    assert request.content_length is None
    assert not request.chunked
    assert not request.expect
    assert request.upgrade is None


@pytest.mark.parametrize(
    "line",
    [
        "GET  /x HTTP/1.1",  # two spaces
        "GET /x  HTTP/1.1",
        "GET /x HTTP/1.1 ",  # trailing space
        " GET /x HTTP/1.1",
        "GET\t/x HTTP/1.1",
        "GET /x HTTP/2.0",
        "GET /x HTTP/1.2",
        "GET /x http/1.1",
        "GET /x",
        "GET /has space HTTP/1.1",
        "get /x HTTP/1.1",  # methods are case-sensitive; none is lower case
        "GET /x\x00 HTTP/1.1",
        "",
    ],
)
def test_a_malformed_request_line_is_refused_with_400(line: str) -> None:
    error = refusal(head(line))
    assert error.status == 400
    assert "request line" in error.message


# ----------------------------------------------------------------- headers


def test_header_names_are_lower_cased_and_kept_in_order_with_repeats() -> None:
    request = parse(
        "Host: example",
        "Impersonate-Group: b",
        "ACCEPT: application/json",
        "impersonate-group: a",
    )
    assert request.headers == (
        ("host", "example"),
        ("impersonate-group", "b"),
        ("accept", "application/json"),
        ("impersonate-group", "a"),
    )


def test_optional_whitespace_around_a_value_is_trimmed_but_inner_whitespace_kept() -> None:
    request = parse("User-Agent: \t kubectl/v1.30  (linux)\t ", "X-Empty:", "X-Blank:   ")
    assert request.headers == (
        HOST,
        ("user-agent", "kubectl/v1.30  (linux)"),
        ("x-empty", ""),
        ("x-blank", ""),
    )


def test_header_values_keep_their_case_and_are_read_as_utf8() -> None:
    raw = b"GET /k8s/clusters/prod/api HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Name: Caf\xc3\xa9 MiXed"
    assert parse_request_head(raw).headers == (HOST, ("x-name", "Caf\xe9 MiXed"))


def test_a_header_value_that_is_not_utf8_is_refused() -> None:
    error = refusal(b"GET /k8s/clusters/prod/api HTTP/1.1\r\nX-Name: Caf\xe9")
    assert error.status == 400
    assert "UTF-8" in error.message


def test_a_long_run_of_spaces_in_a_value_parses_in_linear_time() -> None:
    # The former pattern backtracked quadratically: 60 KiB took seconds.
    value = "a" + " " * 60_000 + "b"
    started = time.process_time()
    request = parse(f"X-Spaces: {value}")
    assert request.headers == (HOST, ("x-spaces", value))
    with pytest.raises(MalformedRequestError):
        parse(f"X-Spaces: {value}\x01")
    assert time.process_time() - started < 0.5


@pytest.mark.parametrize(
    "raw",
    [
        b"X-Bad: a\nInjected: yes",  # bare LF inside a line
        b"X-Bad: a\rInjected: yes",  # bare CR
        b"X-Bad: a\x00b",  # NUL in a value
        b"X-Bad: a\x7fb",  # DEL in a value
        b"X-Bad : value",  # space before the colon
        b"X-Bad\t: value",
        b"X Bad: value",  # not a token
        b": value",  # empty name
        b"X-Bad value",  # no colon
    ],
)
def test_a_malformed_header_line_is_refused_with_400(raw: bytes) -> None:
    error = refusal(b"GET /x HTTP/1.1\r\n" + raw)
    assert error.status == 400
    assert "header" in error.message


@pytest.mark.parametrize("fold", [b" continued", b"\tcontinued"])
def test_obsolete_line_folding_is_refused_with_400(fold: bytes) -> None:
    error = refusal(b"GET /x HTTP/1.1\r\nX-Folded: first\r\n" + fold)
    assert error.status == 400


def test_an_empty_line_inside_the_head_is_refused_with_400() -> None:
    assert refusal(head("GET /x HTTP/1.1", "A: 1", "", "B: 2")).status == 400


# ------------------------------------------------------------------ bounds


def test_a_head_of_exactly_the_maximum_size_is_accepted() -> None:
    prefix = head("GET /x HTTP/1.1", HOST_LINE, "X-Fill: ")
    raw = prefix + b"a" * (MAX_HEAD - len(prefix))
    assert len(raw) == MAX_HEAD
    assert parse_request_head(raw).headers[1][0] == "x-fill"


def test_an_oversize_head_is_refused_with_431() -> None:
    prefix = head("GET /x HTTP/1.1", "X-Fill: ")
    error = refusal(prefix + b"a" * (MAX_HEAD + 1 - len(prefix)))
    assert error.status == 431


def test_the_maximum_number_of_header_lines_is_accepted() -> None:
    request = parse(HOST_LINE, *(f"X-H{n}: {n}" for n in range(MAX_HEADER_LINES - 1)))
    assert len(request.headers) == MAX_HEADER_LINES


def test_too_many_header_lines_are_refused_with_431() -> None:
    error = refusal(head("GET /x HTTP/1.1", *(f"X-H{n}: {n}" for n in range(MAX_HEADER_LINES + 1))))
    assert error.status == 431


def test_an_http11_request_needs_exactly_one_host_header() -> None:
    assert parse_request_head(head("GET /x HTTP/1.0")).headers == ()  # HTTP/1.0 may go without
    missing = refusal(head("GET /x HTTP/1.1", "Accept: */*"))
    assert (missing.status, missing.message) == (
        400,
        "an HTTP/1.1 request needs a Host header (RFC 9112, 3.2)",
    )
    for line in ("GET /x HTTP/1.1", "GET /x HTTP/1.0"):
        twice = refusal(head(line, HOST_LINE, "host: 10.0.0.1"))
        assert (twice.status, twice.message) == (400, "more than one Host header")


def test_bad_request_defaults_to_400_and_keeps_its_message() -> None:
    error = MalformedRequestError("why")
    assert (error.status, error.message, str(error)) == (400, "why", "why")


# ------------------------------------------------------------ body framing


def test_content_length_is_parsed() -> None:
    assert parse("Content-Length: 42").content_length == 42
    assert parse("content-length: 0").content_length == 0


def test_repeated_identical_content_lengths_are_one_length() -> None:
    assert parse("Content-Length: 7", "Content-Length: 7").content_length == 7


@pytest.mark.parametrize(
    "value", ["", "-1", "+5", "0x10", "1e3", "4 2", "4,4", "1.0", "\uff15", "1" * 16]
)
def test_a_non_numeric_content_length_is_refused_with_400(value: str) -> None:
    raw = head("POST /x HTTP/1.1") + b"\r\nContent-Length: " + value.encode("utf-8")
    error = refusal(raw)
    assert error.status == 400
    assert "Content-Length" in error.message


def test_conflicting_content_lengths_are_refused_with_400() -> None:
    error = refusal(head("POST /x HTTP/1.1", "Content-Length: 5", "Content-Length: 6"))
    assert error.status == 400
    assert "conflicting" in error.message


@pytest.mark.parametrize(
    "headers",
    [
        ("Content-Length: 5", "Transfer-Encoding: chunked"),
        ("Transfer-Encoding: chunked", "Content-Length: 5"),
        ("Transfer-Encoding: gzip, chunked", "Content-Length: 0"),
    ],
)
def test_content_length_together_with_transfer_encoding_is_refused_with_400(
    headers: tuple[str, str],
) -> None:
    error = refusal(head("POST /x HTTP/1.1", *headers))
    assert error.status == 400
    assert "Transfer-Encoding" in error.message


def test_transfer_encoding_marks_the_body_as_chunked() -> None:
    request = parse("Transfer-Encoding: chunked")
    assert request.chunked
    assert request.content_length is None


def test_expect_is_noted() -> None:
    assert parse("Expect: 100-continue").expect
    assert not parse("X-Expect: 100-continue").expect


# -------------------------------------------------------------- keep-alive


def test_http11_keeps_the_connection_alive_by_default() -> None:
    assert parse().keep_alive
    assert parse("Connection: keep-alive").keep_alive


@pytest.mark.parametrize(
    "headers",
    [
        ("Connection: close",),
        ("Connection: Close",),
        ("connection: keep-alive, close",),
        ("Connection:  foo ,close ",),
        ("Connection: keep-alive", "Connection: close"),  # repeated headers are one list
    ],
)
def test_http11_connection_close_ends_keep_alive(headers: tuple[str, ...]) -> None:
    assert not parse(*headers).keep_alive


def test_http11_a_token_merely_containing_close_does_not_end_keep_alive() -> None:
    assert parse("Connection: closed, x-close").keep_alive


def test_http10_closes_unless_it_asks_for_keep_alive() -> None:
    http10 = "GET /x HTTP/1.0"
    assert not parse(request_line=http10).keep_alive
    assert parse("Connection: Keep-Alive", request_line=http10).keep_alive


def test_http10_close_wins_over_keep_alive() -> None:
    """RFC 9112 section 9.3: a "close" option ends the connection whatever the version."""
    request = parse("Connection: keep-alive, close", request_line="GET /x HTTP/1.0")
    assert not request.keep_alive


# ----------------------------------------------------------------- upgrade


def test_upgrade_needs_both_connection_upgrade_and_an_upgrade_header() -> None:
    assert parse("Connection: Upgrade", "Upgrade: SPDY/3.1").upgrade == "SPDY/3.1"
    assert parse("Upgrade: websocket", "Connection: keep-alive, upgrade").upgrade == "websocket"
    assert parse("Upgrade: websocket").upgrade is None
    assert parse("Connection: upgrade").upgrade is None
    assert parse("Connection: upgrade", "Upgrade:").upgrade is None
    assert parse("Connection: upgraded", "Upgrade: websocket").upgrade is None


# --------------------------------------------- a connection's repeated header lines

KUBECTL = ("Host: 127.0.0.1", "User-Agent: kubectl/v1.31", "Authorization: Bearer t", "Accept: */*")


def test_repeated_header_lines_parse_as_they_did_with_each_request_line_new() -> None:
    cache = HeaderBlockCache()
    first = parse_request_head(head("GET /k8s/clusters/a/api HTTP/1.1", *KUBECTL), cache)
    second = parse_request_head(head("DELETE /k8s/clusters/a/x HTTP/1.0", *KUBECTL), cache)
    assert (second.method, second.target, second.minor_version) == (
        "DELETE",
        "/k8s/clusters/a/x",
        0,
    )
    assert second.headers == first.headers == parse(*KUBECTL).headers
    # The same object: what a caller decided for the first may be remembered by identity.
    assert second.headers is first.headers
    assert (first.keep_alive, second.keep_alive) == (True, False)  # HTTP/1.0 without keep-alive


def test_other_header_lines_are_parsed_afresh() -> None:
    cache = HeaderBlockCache()
    parse_request_head(head("GET /k8s/clusters/a/api HTTP/1.1", *KUBECTL), cache)
    closing = parse_request_head(
        head("GET /k8s/clusters/a/api HTTP/1.1", *KUBECTL, "Connection: close"), cache
    )
    assert not closing.keep_alive
    assert closing.headers[-1] == ("connection", "close")
    with pytest.raises(MalformedRequestError) as caught:
        parse_request_head(head("GET /k8s/clusters/a/api HTTP/1.1", "Bad Header: x"), cache)
    assert caught.value.message == "malformed header line"


def test_a_caller_cannot_change_the_headers_the_next_parse_gives() -> None:
    # The remembered headers are shared by every parse of the same block: immutable.
    cache = HeaderBlockCache()
    first = parse_request_head(head("GET /k8s/clusters/a/api HTTP/1.1", *KUBECTL), cache)
    assert isinstance(first.headers, tuple)
    assert all(isinstance(pair, tuple) for pair in first.headers)


def test_a_refused_block_is_refused_every_time() -> None:
    cache = HeaderBlockCache()
    bad = head("GET /k8s/clusters/a/api HTTP/1.1", "X-Value: a\x01b")
    for _ in range(2):
        with pytest.raises(MalformedRequestError):
            parse_request_head(bad, cache)


def test_a_large_header_block_is_parsed_but_not_remembered() -> None:
    cache = HeaderBlockCache()
    large = (*KUBECTL, "X-Large: " + "v" * CACHED_BLOCK)
    for _ in range(2):
        request = parse_request_head(head("GET /k8s/clusters/a/api HTTP/1.1", *large), cache)
        assert request.headers[-1] == ("x-large", "v" * CACHED_BLOCK)
    assert cache._raw is None  # an idle connection holds no large block


def test_a_bad_request_line_is_refused_whatever_its_header_lines() -> None:
    cache = HeaderBlockCache()
    parse_request_head(head("GET /k8s/clusters/a/api HTTP/1.1", *KUBECTL), cache)
    with pytest.raises(MalformedRequestError) as caught:
        parse_request_head(head("GET  /k8s/clusters/a/api HTTP/1.1", *KUBECTL), cache)
    assert caught.value.message == "malformed request line"


def test_a_request_target_too_long_is_answered_414() -> None:
    target = "/k8s/clusters/a/api/v1/pods?labelSelector=" + "a" * MAX_TARGET
    with pytest.raises(MalformedRequestError) as caught:
        parse_request_head(head(f"GET {target} HTTP/1.1", *KUBECTL))
    assert (caught.value.status, caught.value.message) == (
        414,
        f"the request target is longer than {MAX_TARGET} characters",
    )
    longest = "/k8s/clusters/a/api/v1/pods?labelSelector="
    longest += "a" * (MAX_TARGET - len(longest))
    assert parse_request_head(head(f"GET {longest} HTTP/1.1", *KUBECTL)).target == longest


# --------------------------------------------------------------- responses


def test_response_head_is_a_status_line_headers_and_a_blank_line() -> None:
    encoded = response_head(
        200, "OK", [("content-type", "application/json"), ("content-length", "2")]
    )
    assert encoded == (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n"
    )


def test_response_head_without_headers_still_ends_with_a_blank_line() -> None:
    assert response_head(204, "No Content", []) == b"HTTP/1.1 204 No Content\r\n\r\n"


def test_response_head_keeps_a_safe_reason_as_given() -> None:
    assert response_head(200, "Fine\tThanks", []).startswith(b"HTTP/1.1 200 Fine\tThanks\r\n")


@pytest.mark.parametrize(
    "reason",
    [
        "OK\r\nSet-Cookie: injected=1",
        "OK\nX: y",
        "OK\rX: y",
        "bad\x00",
        "",
        "x" * 129,
        "caf\xe9",
    ],
)
def test_response_head_replaces_an_unsafe_reason(reason: str) -> None:
    encoded = response_head(404, reason, [("content-length", "0")])
    assert encoded == b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"


def test_response_head_with_an_unknown_status_and_unsafe_reason_says_unknown() -> None:
    assert response_head(599, "a\r\nb", []) == b"HTTP/1.1 599 Unknown\r\n\r\n"


def test_chunk_frames_data_with_its_hexadecimal_length() -> None:
    assert chunk(b"hello") == b"5\r\nhello\r\n"
    assert chunk(b"x" * 255) == b"ff\r\n" + b"x" * 255 + b"\r\n"
    assert chunk(b"\r\n0\r\n\r\n") == b"7\r\n\r\n0\r\n\r\n\r\n"  # data is opaque
