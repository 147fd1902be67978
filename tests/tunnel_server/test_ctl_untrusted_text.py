"""tunnelctl prints what agents and tools said without letting it drive the terminal.

A command's log comes from helm, tofu or a chart in the cluster, and its error and output names
from the agent: an escape sequence in any of them could move the cursor, hide lines, retitle the
terminal or write to its clipboard (OSC 52).
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tunnel_cli import printable_line
from tunnel_server.ctl.client import CtlError
from tunnel_server.ctl.commands import command_logs, run_command, show_command

HOSTILE = "done\x1b]52;c;ZXZpbA==\x07\x1b[2A\x1b[Kok\u202e"
NEUTRAL = "done?]52;c;ZXZpbA==??[2A?[Kok?"


class FakeClient:
    """Answers as the server would, with what an agent said in every field it controls."""

    COMMAND: ClassVar[dict[str, Any]] = {
        "id": "c-1",
        "cluster": "prod",
        "type": "tofu",
        "name": "infra",
        "state": "failed",
        "attempt": 1,
        "submitter": "ann",
        "created_at": "2026-11-27T00:00:00+00:00",
        "started_at": None,
        "finished_at": None,
        "error": HOSTILE,
        "cancel_requested": False,
        "result": {"outputs": [HOSTILE], "summary": {}},
    }

    def request(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        return self.COMMAND

    def records(self, path: str) -> Iterator[dict[str, Any]]:
        yield {"text": HOSTILE}
        yield {"text": "a\ttable\trow"}
        yield {"command": self.COMMAND}


def test_a_log_line_keeps_its_tabs_and_loses_its_escapes() -> None:
    assert printable_line(HOSTILE) == NEUTRAL
    assert printable_line("a\tb") == "a\tb"


def test_command_logs_are_printed_neutralised(capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(id="c-1", follow=True)
    assert command_logs(FakeClient(), args) == 1  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert out == f"{NEUTRAL}\na\ttable\trow\n"


def test_show_prints_the_agents_error_and_output_names_neutralised(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert show_command(FakeClient(), argparse.Namespace(id="c-1", output="text")) == 0  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert "\x1b" not in out
    assert "\u202e" not in out
    assert f"error:        {NEUTRAL}\n" in out
    assert f"outputs:      {NEUTRAL} (values stay in the cluster)\n" in out


def run_follow_args(tmp_path: Path) -> argparse.Namespace:
    """``tunnelctl run --cluster prod -f SPEC --follow``, with a valid query spec."""
    spec = tmp_path / "spec.yaml"
    spec.write_text("apiVersion: tunnel/v1\ntype: query\nname: q\nspec: {}\n")
    return argparse.Namespace(
        file=str(spec),
        timeout=None,
        idempotency_key=None,
        cluster="prod",
        follow=True,
        output="text",
    )


def test_run_follow_prints_the_outcome_neutralised(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    args = run_follow_args(tmp_path)
    assert run_command(FakeClient(), args) == 1  # type: ignore[arg-type]
    captured = capsys.readouterr()
    assert "\x1b" not in captured.out + captured.err
    assert f"# command c-1 failed: {NEUTRAL}\n" in captured.err


def test_an_error_from_the_server_is_one_line_without_escapes(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def fails(*_: Any) -> int:
        raise CtlError(f"no command {HOSTILE!s}\nsecond line")

    ctl_main = importlib.import_module("tunnel_server.ctl.main")
    monkeypatch.setattr(ctl_main, "make_client", lambda args: None)
    parser = ctl_main.build_parser()
    real_parse = parser.parse_args
    monkeypatch.setattr(ctl_main, "build_parser", lambda: _Parser(real_parse, fails))
    assert ctl_main.main(["whoami"]) == 1
    err = capsys.readouterr().err
    assert err == f"tunnelctl: no command {NEUTRAL}?second line\n"


class _Parser:
    def __init__(self, parse: Any, run: Any) -> None:
        self._parse, self._run = parse, run

    def parse_args(self, argv: list[str] | None) -> argparse.Namespace:
        args: argparse.Namespace = self._parse(argv)
        args.run = self._run
        return args


class EndedClient(FakeClient):
    """A server that could not go on with the log: keepalives, then an error record."""

    def records(self, path: str) -> Iterator[dict[str, Any]]:
        yield {"text": "one"}
        yield {"keepalive": True}
        yield {"error": "command c-1 was deleted while being read (its retention passed)"}


def test_a_log_the_server_cannot_go_on_with_ends_in_an_error_naming_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(CtlError, match="deleted while being read"):
        command_logs(EndedClient(), argparse.Namespace(id="c-1", follow=True))  # type: ignore[arg-type]
    assert capsys.readouterr().out == "one\n"  # the keepalive prints nothing


def test_run_follow_cut_short_says_how_to_follow_again(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    args = run_follow_args(tmp_path)
    with pytest.raises(CtlError) as ended:
        run_command(EndedClient(), args)  # type: ignore[arg-type]
    assert str(ended.value) == (
        "command c-1 was deleted while being read (its retention passed)"
        " (to follow it again: tunnelctl commands logs c-1 --follow)"
    )
