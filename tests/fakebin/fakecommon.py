"""What the fake ``helm`` and ``tofu`` share: recording a call, failing, hanging.

Run by the fakes (their directory is first on ``sys.path``), never imported
by tests. Settings come from the environment:

- ``FAKEBIN_RECORD``: a JSON-lines file; each call appends one record
- ``FAKEBIN_FAIL``: a subcommand (``upgrade``, ``init``, ``apply`` ...) that fails
- ``FAKEBIN_HANG``: a subcommand that hangs; ``FAKEBIN_PIDS`` gets its pid and
  its child's, then it prints ``hanging`` and sleeps (with a child in its group)
- ``FAKEBIN_IGNORE_TERM``: set, the hanging process and its child ignore SIGTERM
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_RECORDED_PREFIXES = ("TF_VAR_", "TF_", "HELM_")
_RECORDED = ("KUBECONFIG", "CHECKPOINT_DISABLE", "HOME")


def record(tool: str, **extra: Any) -> None:
    """Append this call (argv, cwd, the relevant environment, ``extra``) to the record."""
    target = os.environ.get("FAKEBIN_RECORD")
    if not target:
        return
    environment = {
        key: value
        for key, value in os.environ.items()
        if key.startswith(_RECORDED_PREFIXES) or key in _RECORDED
    }
    entry = {
        "tool": tool,
        "argv": sys.argv[1:],
        "cwd": os.getcwd(),
        "env": environment,
        "env_names": sorted(os.environ),
        "pid": os.getpid(),
        "pgid": os.getpgid(0),
        **extra,
    }
    with Path(target).open("a", encoding="utf-8") as file:
        file.write(json.dumps(entry) + "\n")


def fail_or_hang(subcommand: str, error: str) -> None:
    """Fail (exit 1, ``error`` on stderr) or hang, as the environment asks for ``subcommand``."""
    if os.environ.get("FAKEBIN_FAIL") == subcommand:
        print(error, file=sys.stderr, flush=True)
        sys.exit(1)
    if os.environ.get("FAKEBIN_HANG") == subcommand:
        _hang()


def _hang() -> None:
    ignore = bool(os.environ.get("FAKEBIN_IGNORE_TERM"))
    if ignore:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child_code = "import signal, time\n"
    if ignore:
        child_code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    child_code += "time.sleep(3600)\n"
    child = subprocess.Popen([sys.executable, "-c", child_code])
    pids = os.environ.get("FAKEBIN_PIDS")
    if pids:
        Path(pids).write_text(json.dumps({"pid": os.getpid(), "child": child.pid}))
    print("hanging", flush=True)
    time.sleep(3600)
    sys.exit(0)
