"""tunnelctl's grant --impersonate [USER|group:GROUP], and the audit table's AS column."""

from __future__ import annotations

from typing import Any

import pytest

from tunnel_server.ctl.client import CtlError
from tunnel_server.ctl.main import build_parser


class Recorder:
    """Answers every request with ``answer`` and keeps what was sent."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.sent: list[tuple[str, str, Any]] = []

    def request(self, method: str, path: str, body: Any = None) -> Any:
        self.sent.append((method, path, body))
        return self.answer


def run(argv: list[str], answer: Any, capsys: pytest.CaptureFixture[str]) -> tuple[Recorder, str]:
    args = build_parser().parse_args(argv)
    client = Recorder(answer)
    assert args.run(client, args) == 0
    return client, capsys.readouterr().out


@pytest.mark.parametrize(
    ("flags", "impersonate", "targets"),
    [
        ([], False, []),
        (["--impersonate"], True, []),
        (["--impersonate", "alice", "--impersonate", "group:ops"], True, ["alice", "group:ops"]),
    ],
)
def test_grant_sends_whom_the_user_may_impersonate(
    flags: list[str], impersonate: bool, targets: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    client, _ = run(["grant", "carol", "--cluster", "prod", *flags], {}, capsys)
    [(method, path, body)] = client.sent
    assert (method, path) == ("PUT", "/api/v1/grants/carol/prod")
    assert body["impersonate"] is impersonate
    assert body["impersonate_targets"] == targets


def test_grant_refuses_anyone_and_names_at_once() -> None:
    args = build_parser().parse_args(
        ["grant", "carol", "--cluster", "prod", "--impersonate", "--impersonate", "alice"]
    )
    client = Recorder({})
    with pytest.raises(CtlError, match=r"alone .* or with names"):
        args.run(client, args)
    assert client.sent == []


def test_the_grants_table_says_whom(capsys: pytest.CaptureFixture[str]) -> None:
    grants = [
        {"user": "a", "cluster": "p", "impersonate": False, "impersonate_targets": []},
        {"user": "b", "cluster": "p", "impersonate": True, "impersonate_targets": []},
        {"user": "c", "cluster": "p", "impersonate": True, "impersonate_targets": ["alice"]},
    ]
    _, out = run(["grants"], grants, capsys)
    rows = [line.split() for line in out.splitlines()[1:]]
    assert [row[-1] for row in rows] == ["no", "anyone", "alice"]


def test_the_audit_table_shows_the_identity_sent_and_its_origin(
    capsys: pytest.CaptureFixture[str],
) -> None:
    events = [
        {
            "time": "t1",
            "user": "carol",
            "cluster": "prod",
            "kind": "proxy",
            "verb": "list",
            "path": "/api/v1/pods",
            "status": 200,
            "detail": {
                "as": {"user": "tunnel:alice", "groups": ["tunnel:platform"], "impersonated": True}
            },
        },
        {
            "time": "t2",
            "user": "alice",
            "cluster": "prod",
            "kind": "proxy",
            "verb": "get",
            "path": "/api/v1/pods/x",
            "status": 200,
            "detail": {"as": {"user": "tunnel:alice", "groups": [], "impersonated": False}},
        },
    ]
    _, out = run(["audit"], events, capsys)
    lines = out.splitlines()
    assert "AS" in lines[0].split()
    assert "tunnel:alice [tunnel:platform] (--as)" in lines[1]
    assert "tunnel:alice" in lines[2]
    assert "(--as)" not in lines[2]


def test_the_audit_json_keeps_the_identity_in_the_detail(
    capsys: pytest.CaptureFixture[str],
) -> None:
    events = [{"user": "carol", "detail": {"as": {"user": "tunnel:alice", "impersonated": True}}}]
    _, out = run(["audit", "-o", "json"], events, capsys)
    assert '"impersonated": true' in out
