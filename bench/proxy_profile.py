"""Where the relays' time goes: py-spy samples of a running process, folded.

``py-spy record --format raw`` writes collapsed stacks (one line per distinct
stack, ``frame;frame;... count``). :func:`summarise` turns them into the two
views that matter: *self* time by function and line (where the interpreter
was when sampled) and *inclusive* time by function (what the time was spent
under).

By default py-spy samples the wall-clock time of threads that are not idle,
so a thread that is runnable but waiting for a core (the rule on a 2-core
machine shared by four busy processes) is counted where it stands: mostly in
the ``send()`` that woke its peer and got it preempted. The benchmark
therefore samples with ``--gil`` (the thread holding the GIL only), which
approximates where the Python CPU time goes; /proc's user and system CPU per
request are the figures to read beside it.
"""

from __future__ import annotations

import re
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from .procs import Children

__all__ = ["COMPONENTS", "Profile", "py_spy", "record", "summarise"]

_LINE = re.compile(r":\d+\)$")
_FILE = re.compile(r"\((.*):\d+\)$")

#: Where self time goes, by the file of the innermost Python frame (first match wins).
#: C code is counted with the Python frame that called it (OpenSSL under ssl.py).
COMPONENTS = (
    ("audit + store (SQLite thread)", ("sqlite", "tunnel_server/store/", "tunnel_server/audit")),
    ("thread hand-off", ("concurrent/futures", "threading.py", "queue.py")),
    ("metrics", ("prometheus_client", "metrics.py")),
    ("proxy logic", ("kubeproxy.py", "tunnel_agent/policy", "tunnel_kube/", "tunnel_server/auth")),
    ("proxy logic", ("tunnel_server/proxyrequest",)),
    ("proxy logic", ("tunnel_server/access", "tunnel_server/context", "tunnel_agent/router")),
    ("proxy logic", ("tunnel_server/app.py", "tunnel_agent/kubeapi", "urllib/parse")),
    ("lean HTTP/1.1 (front door, client)", ("tunnel_server/frontdoor", "tunnel_server/http1")),
    ("lean HTTP/1.1 (front door, client)", ("tunnel_agent/upstream", "httptools")),
    ("mux session", ("tunnel_mux/session", "tunnel_mux/stream", "tunnel_mux/upgraded")),
    ("protocol core + msgpack", ("protocol/", "msgpack")),
    ("WebSocket (aiohttp)", ("aiohttp/_websocket", "aiohttp/web_ws", "aiohttp/client_ws")),
    ("WebSocket (aiohttp)", ("tunnel_mux/websocket",)),
    ("aiohttp client API", ("aiohttp/client", "aiohttp/connector", "kubernetes_asyncio")),
    ("aiohttp server API", ("aiohttp/web",)),
    # Parser, writer, streams, helpers: the server's in the server, the client's in the agent.
    ("aiohttp HTTP/1.1 plumbing", ("aiohttp/", "yarl", "multidict")),
    ("TLS (ssl, sslproto)", ("ssl.py", "asyncio/sslproto")),
    ("event loop (asyncio)", ("asyncio/", "selectors.py", "_weakrefset")),
)


def py_spy() -> str | None:
    """The py-spy executable next to this Python, or on PATH."""
    from sys import executable

    beside = Path(executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


@dataclass(frozen=True, slots=True)
class Profile:
    """Folded samples of one process."""

    name: str
    samples: int
    threads: list[tuple[str, int]]
    components: list[tuple[str, int]]
    self_time: list[tuple[str, int]]
    inclusive: list[tuple[str, int]]
    raw: Path

    def lines(self, top: int = 18) -> list[str]:
        if self.samples == 0:
            return [f"{self.name}: no samples (py-spy failed? see its log)"]
        threads = ", ".join(f"{name} {100 * n / self.samples:.0f}%" for name, n in self.threads)
        parts = ", ".join(
            f"{name} {100 * n / self.samples:.0f}%" for name, n in self.components if n
        )
        out = [
            f"{self.name}: {self.samples} samples (threads: {threads})",
            f"  by component (self time): {parts}",
            "  self:",
        ]
        for frame, count in self.self_time[:top]:
            out.append(f"    {100 * count / self.samples:5.1f}%  {_short(frame)}")
        out.append("  inclusive (product and library frames):")
        for frame, count in self.inclusive[:top]:
            out.append(f"    {100 * count / self.samples:5.1f}%  {_short(frame)}")
        return out


async def record(
    children: Children,
    tool: str,
    pid: int,
    name: str,
    seconds: int,
    directory: Path,
    *,
    gil: bool,
) -> Path:
    """Sample ``pid`` for ``seconds`` (100 Hz, without pausing it); return the raw file.

    With ``gil``, only the thread holding the GIL is sampled: Python's own CPU
    time, without the system calls and OpenSSL work that run without the GIL,
    and without the time a thread waits for a core elsewhere.
    """
    raw = directory / f"profile-{name}.txt"
    argv = [tool, "record", "--pid", str(pid), "--duration", str(seconds), "--rate", "100"]
    argv += ["--nonblocking", "--threads", "--format", "raw", "--output", str(raw)]
    if gil:
        argv.append("--gil")
    await children.run(f"py-spy-{name}", argv, within=seconds + 30.0)
    return raw


def summarise(name: str, raw: Path) -> Profile:
    """Fold a raw py-spy file into self and inclusive time."""
    threads: Counter[str] = Counter()
    components: Counter[str] = Counter()
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    samples = 0
    text = raw.read_text(errors="replace") if raw.exists() else ""
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        samples += count
        frames = stack.split(";")
        if frames[0].startswith("thread ("):  # --threads: "thread (TID): NAME" comes first
            threads[frames[0].partition(": ")[2] or frames[0]] += count
            frames = frames[1:] or ["(no Python frame)"]
        self_time[frames[-1]] += count
        components[_component(frames[-1])] += count
        seen = set()
        for frame in frames:
            function = _LINE.sub(")", frame)
            if function not in seen and _interesting(function):
                seen.add(function)
                inclusive[function] += count
    return Profile(
        name,
        samples,
        threads.most_common(),
        components.most_common(),
        self_time.most_common(),
        inclusive.most_common(),
        raw,
    )


def _component(frame: str) -> str:
    found = _FILE.search(frame)
    path = found.group(1) if found else ""
    for name, markers in COMPONENTS:
        if any(marker in path for marker in markers):
            return name
    return "other"


def _interesting(function: str) -> bool:
    # Frames that enclose everything: the event loop's own, the entry points, threads.
    boring = ("asyncio/runners.py", "asyncio/base_events.py", "asyncio/events.py", "threading.py")
    if function.startswith(("<", "main (", "_run_module_as_main", "_run_code")):
        return False
    return not any(part in function for part in boring)


def _short(frame: str) -> str:
    # py-spy names files relative to sys.path already; drop absolute prefixes it kept.
    return re.sub(r"\(/\S*/(site-packages|python3\.\d+|main)/", "(", frame)
