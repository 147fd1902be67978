"""What a proxied request's audit event says about how it ended."""

from __future__ import annotations

import io

from protocol import kinds
from tunnel_mux import SessionClosedError, StreamResetError
from tunnel_server.ctl.output import print_table
from tunnel_server.proxy.exchange import MAX_ENDED_CHARS, ProxyExchange
from tunnel_server.proxy.refusal import ProxyRefusal


def exchange() -> ProxyExchange:
    return ProxyExchange(cluster="prod-eu", method="GET")


def test_a_refusal_records_its_status_and_its_message() -> None:
    request = exchange()
    request.refused(ProxyRefusal(403, "Forbidden", "user alice has no grant on cluster prod-eu"))
    assert (request.status, request.ended) == (403, "user alice has no grant on cluster prod-eu")


def test_access_revoked_is_said_as_such_not_as_a_reset_code() -> None:
    request = exchange()
    request.cut_short(
        StreamResetError(kinds.HTTP_ACCESS_REVOKED, "user alice was deleted", remote=False)
    )
    assert request.ended == "access revoked: user alice was deleted"


def test_a_reset_by_the_agent_and_a_lost_session_are_told_apart() -> None:
    reset, lost = exchange(), exchange()
    reset.cut_short(StreamResetError(0x8, "upstream went away"))
    lost.cut_short(SessionClosedError("the connection to the peer was lost"))
    assert reset.ended.startswith("cut short: stream reset by the peer (")
    assert reset.ended.endswith("): upstream went away")
    assert lost.ended == (
        "the session with the cluster's agent ended: the connection to the peer was lost"
    )


def test_an_agents_reason_is_recorded_without_control_characters_and_bounded() -> None:
    # The agent is not trusted: its reason must not draw rows in an admin's terminal.
    request = exchange()
    request.cut_short(StreamResetError(0x8, "fine\n2026-01-01 admin grant\x1b[2J" + "x" * 1000))
    assert request.ended.isprintable()
    assert "fine?2026-01-01 admin grant?[2J" in request.ended
    assert len(request.ended) == MAX_ENDED_CHARS


def test_tunnelctl_prints_one_line_per_row_whatever_the_server_returned() -> None:
    out = io.StringIO()
    rows = [{"path": "/a\n/b", "detail": {"ended": "x\r\x1b[1Ay"}}, {"path": "/c", "detail": {}}]
    print_table(rows, [("PATH", "path"), ("DETAIL", "detail")], out)
    lines = out.getvalue().splitlines()
    assert [line.split()[0] for line in lines] == ["PATH", "/a?/b", "/c"]
    assert lines[1].split()[1] == "ended=x??[1Ay"
    assert lines[2].split()[1] == "-"
