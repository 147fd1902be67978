"""The OpenSSH baseline: ``sshd`` on a loopback port and ``ssh -R`` reverse tunnels.

A private ``sshd`` runs on 127.0.0.1 with a throw-away host key, an
authorized key made for the run and no PAM, from a temporary directory. Each
variant is one ``ssh -R 127.0.0.1:PORT:127.0.0.1:UPSTREAM`` client, as the
agent would run it in the cluster; clients then call 127.0.0.1:PORT and sshd
carries each connection to the ssh client, which connects to the upstream.

Two variants, because OpenSSH turns Nagle off differently at each end:

- ``ssh``: ``ssh -tt -R ... 'exec sleep ...'``, a session with a pty. Both
  ends then set TCP_NODELAY on the SSH connection: the client because the
  session is interactive, sshd because a pty was allocated.
- ``ssh -N``: ``ssh -tt -N -R ...``, no session. The ssh client still sets
  TCP_NODELAY (ssh.c does so for -N), but sshd does not on its side of the
  connection (no pty is ever requested), so requests from sshd to the client
  meet Nagle's algorithm and delayed ACKs (40 ms stalls on loopback).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from .procs import BenchError, Children, descendants, free_port, wait_port

__all__ = ["SSHD", "SshBaseline", "start_ssh"]

SSHD = "/usr/sbin/sshd"
SSH = "/usr/bin/ssh"
SSH_KEYGEN = "/usr/bin/ssh-keygen"
#: Variants: name -> whether the client opens a pty session (see the module docstring).
VARIANTS = {"ssh": True, "ssh -N": False}
_CIPHER = re.compile(r"kex: server->client cipher: (\S+)")

_SSHD_CONFIG = """\
Port {port}
ListenAddress 127.0.0.1
HostKey {directory}/host_key
PidFile {directory}/sshd.pid
AuthorizedKeysFile {directory}/authorized_keys
StrictModes no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
AllowTcpForwarding remote
GatewayPorts no
X11Forwarding no
PermitTTY yes
PrintMotd no
PrintLastLog no
MaxStartups 100
LogLevel ERROR
"""


@dataclass
class SshBaseline:
    """A running sshd and one ssh client per variant."""

    sshd: asyncio.subprocess.Process
    #: variant -> (ssh client process, forwarded port on 127.0.0.1)
    clients: dict[str, tuple[asyncio.subprocess.Process, int]] = field(default_factory=dict)
    cipher: str = "unknown"

    def pids(self, variant: str) -> dict[str, list[int]]:
        """The processes that relay for ``variant``: sshd (all of its tree) and the client."""
        client, _ = self.clients[variant]
        return {"sshd": [self.sshd.pid, *descendants(self.sshd.pid)], "ssh": [client.pid]}


def _keygen(path: Path) -> None:
    subprocess.run(
        [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", "bench", "-f", str(path)],
        check=True,
        capture_output=True,
    )


async def start_ssh(
    children: Children, directory: Path, upstream_port: int, variants: list[str]
) -> SshBaseline:
    """Start sshd and one ``ssh -R`` client per variant; wait until each forward works."""
    port = free_port()
    config = _prepare(directory, port)
    sshd = await children.start("sshd", [SSHD, "-D", "-e", "-f", str(config)])
    await wait_port(port, sshd, "sshd")
    baseline = SshBaseline(sshd)
    for variant in variants:
        forwarded = free_port()
        log = directory / f"{variant.replace(' ', '')}.log"
        argv = [SSH, "-v", "-E", str(log), "-tt", "-i", str(directory / "client_key")]
        argv += ["-p", str(port), "-o", "StrictHostKeyChecking=no", "-o", "BatchMode=yes"]
        argv += ["-o", f"UserKnownHostsFile={directory}/known_hosts"]
        argv += ["-o", "ExitOnForwardFailure=yes", "-o", "ServerAliveInterval=0"]
        argv += ["-R", f"127.0.0.1:{forwarded}:127.0.0.1:{upstream_port}"]
        if VARIANTS[variant]:
            argv += ["root@127.0.0.1", "exec sleep 2147483647"]
        else:
            argv += ["-N", "root@127.0.0.1"]
        client = await children.start(variant.replace(" ", ""), argv)
        try:
            await wait_port(forwarded, client, f"the {variant!r} client")
        except BenchError as exc:
            raise BenchError(f"{exc}; see {log}") from exc
        baseline.clients[variant] = (client, forwarded)
        baseline.cipher = _cipher(log) or baseline.cipher
    return baseline


def _prepare(directory: Path, port: int) -> Path:
    """Keys, authorized_keys and sshd_config in ``directory``; return the config's path."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    _keygen(directory / "host_key")
    _keygen(directory / "client_key")
    (directory / "authorized_keys").write_text((directory / "client_key.pub").read_text())
    config = directory / "sshd_config"
    config.write_text(_SSHD_CONFIG.format(port=port, directory=directory))
    # sshd refuses to start without its privilege separation directory.
    with contextlib.suppress(FileExistsError):
        os.mkdir("/run/sshd", 0o755)
    return config


def _cipher(log: Path) -> str | None:
    found = _CIPHER.search(log.read_text(errors="replace"))
    return found.group(1) if found else None
