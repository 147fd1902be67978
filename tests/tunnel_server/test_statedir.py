"""The state directory keeps its secrets the owner's alone, whatever a volume did to them."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tunnel_server.app import start_server
from tunnel_server.clock import utcnow
from tunnel_server.errors import ConfigError
from tunnel_server.statedir import PRIVATE_FILES, prepare_state_dir

from ..integration.harness import running_server, server_settings


def test_secrets_opened_to_the_group_are_made_private_again_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = server_settings(tmp_path / "state")
    prepare_state_dir(settings, utcnow())
    state = settings.state_dir
    (state / "admin-token").write_text("tat_x")
    (state / "state.db").write_bytes(b"")
    # What the kubelet does to a volume mounted with an fsGroup, on each mount.
    for name in ("ca.key", "server.key", "admin-token", "state.db"):
        (state / name).chmod(0o660)
    (state / "ca.crt").chmod(0o664)
    with caplog.at_level(logging.WARNING, logger="tunnel_server.statedir"):
        prepare_state_dir(settings, utcnow())
    for name in ("ca.key", "server.key", "admin-token", "state.db"):
        assert (state / name).stat().st_mode & 0o777 == 0o600, name
    assert (state / "ca.crt").stat().st_mode & 0o777 == 0o664  # a certificate is public
    warned = [record.getMessage() for record in caplog.records]
    assert any("ca.key was open to others (mode 660); made 600" in text for text in warned)
    assert set(PRIVATE_FILES) >= {"ca.key", "server.key", "admin-token", "state.db"}


async def test_one_server_at_a_time_uses_a_state_directory(tmp_path: Path) -> None:
    settings = server_settings(tmp_path / "state")
    async with running_server(settings):
        # A second would keep its own list of what is revoked, blind to the first's.
        with pytest.raises(ConfigError, match="another tunnel-server is using the state directory"):
            await start_server(settings)
    # Once the first has stopped, the directory is free again.
    async with running_server(settings) as again:
        assert again.port > 0
