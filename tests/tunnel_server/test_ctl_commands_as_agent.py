"""tunnelctl grant --commands-as-agent, and the grants table's COMMANDS column."""

from __future__ import annotations

import pytest

from tests.tunnel_server.test_ctl_impersonation import run


@pytest.mark.parametrize(
    ("flags", "commands", "as_agent"),
    [
        ([], False, False),
        (["--commands"], True, False),
        (["--commands", "--commands-as-agent"], True, True),
        (["--commands-as-agent"], True, True),  # implies --commands
    ],
)
def test_grant_sends_whether_commands_act_as_the_agent(
    flags: list[str], commands: bool, as_agent: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    client, _ = run(["grant", "carol", "--cluster", "prod", *flags], {}, capsys)
    [(_, _, body)] = client.sent
    assert body["commands"] is commands
    assert body["commands_as_agent"] is as_agent


def test_the_grants_table_says_as_whom_commands_act(capsys: pytest.CaptureFixture[str]) -> None:
    grants = [
        {"user": "a", "cluster": "p", "commands": False},
        {"user": "b", "cluster": "p", "commands": True, "commands_as_agent": False},
        {"user": "c", "cluster": "p", "commands": True, "commands_as_agent": True},
    ]
    _, out = run(["grants"], grants, capsys)
    rows = [line.split() for line in out.splitlines()[1:]]
    assert [row[-2] for row in rows] == ["no", "as-user", "as-agent"]
