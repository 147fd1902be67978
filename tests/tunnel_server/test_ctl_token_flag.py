"""tunnelctl --token works, and warns that ps shows it; the file and the variable do not warn."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

import pytest

from tunnel_server.ctl.client import ApiClient, CtlError

# The package's ``main`` is the entry point, which hides the module of that name.
ctl_main = importlib.import_module("tunnel_server.ctl.main")

TOKEN = "tat_the-admins-own-token"


@pytest.fixture
def tokens_used(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The tokens tunnelctl would connect with; it stops before connecting."""
    for name in ("TUNNELCTL_TOKEN", "TUNNELCTL_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    used: list[str] = []

    def make_client(args: argparse.Namespace) -> ApiClient:
        used.append(args.token or Path(args.token_file).read_text().strip())
        raise CtlError("stopped before connecting")

    monkeypatch.setattr(ctl_main, "make_client", make_client)
    return used


def test_a_token_given_as_a_flag_is_used_with_a_warning_to_use_the_file_or_variable(
    tokens_used: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert ctl_main.main(["--token", TOKEN, "whoami"]) == 1
    assert tokens_used == [TOKEN]
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        "tunnelctl: warning: --token puts the API token on the command line, where anyone on "
        "this machine can read it (ps, /proc); use --token-file or TUNNELCTL_TOKEN instead",
        "tunnelctl: stopped before connecting",
    ]
    assert TOKEN not in captured.err


def test_the_equals_form_of_the_flag_warns_too(
    tokens_used: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    ctl_main.main([f"--token={TOKEN}", "whoami"])
    assert tokens_used == [TOKEN]
    assert "warning: --token puts the API token" in capsys.readouterr().err


def test_a_token_from_the_environment_does_not_warn(
    tokens_used: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TUNNELCTL_TOKEN", TOKEN)
    ctl_main.main(["whoami"])
    assert tokens_used == [TOKEN]
    assert capsys.readouterr().err == "tunnelctl: stopped before connecting\n"


def test_a_token_from_a_file_does_not_warn(
    tokens_used: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "token").write_text(TOKEN + "\n")
    ctl_main.main(["--token-file", str(tmp_path / "token"), "whoami"])
    assert tokens_used == [TOKEN]
    assert capsys.readouterr().err == "tunnelctl: stopped before connecting\n"
