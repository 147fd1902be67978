"""``tunnel-server create-ca``: the CA several replicas share, made once."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tunnel_pki.ca import CertificateAuthority
from tunnel_server.cli import main


def test_a_new_ca_is_written_with_its_key_private(tmp_path: Path) -> None:
    assert main(["create-ca", "--out", str(tmp_path / "ca")]) == 0
    key = tmp_path / "ca" / "ca.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    ca = CertificateAuthority.load((tmp_path / "ca" / "ca.crt").read_bytes(), key.read_bytes())
    assert ca.certificate.subject.rfc4514_string().startswith("CN=tunnel CA")


def test_an_existing_ca_is_never_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["create-ca", "--out", str(tmp_path)]) == 0
    before = (tmp_path / "ca.key").read_bytes()
    assert main(["create-ca", "--out", str(tmp_path)]) == 1
    assert "already holds a CA" in capsys.readouterr().err
    assert (tmp_path / "ca.key").read_bytes() == before
