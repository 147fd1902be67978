"""The command benchmark's figures: from the POSTs, the agents' events and the server's store.

The server's SQLite file is read after each phase (read-only, beside the
running server, as WAL allows): it is the durable truth of which commands
reached ``succeeded`` and when, and its timestamps split a command's latency
into stages. Also here: the py-spy profile summary and the printed tables.
"""

from __future__ import annotations

import math
import sqlite3
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from .commands_load import AgentEvents, Submission, percentiles

__all__ = [
    "Stored",
    "latency_figures",
    "profile_summary",
    "stored_commands",
    "table",
    "throughput_figures",
]


@dataclass(frozen=True, slots=True)
class Stored:
    """A command as the server stored it; times are POSIX seconds, NaN when unset."""

    name: str
    state: str
    created: float
    delivered: float
    started: float
    finished: float


def _seconds(value: str | None) -> float:
    return math.nan if value is None else datetime.fromisoformat(value).timestamp()


def stored_commands(db: Path, prefix: str) -> dict[str, Stored]:
    """Every command whose name starts with ``prefix-``, by name, from the server's file."""
    connection = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10.0)
    try:
        rows = connection.execute(
            "SELECT name, state, created_at, delivered_at, started_at, finished_at"
            " FROM commands WHERE name LIKE ?",
            (f"{prefix}-%",),
        ).fetchall()
    finally:
        connection.close()
    return {
        row[0]: Stored(
            row[0], row[1], _seconds(row[2]), _seconds(row[3]), _seconds(row[4]), _seconds(row[5])
        )
        for row in rows
    }


def _ms(values: Sequence[float]) -> list[float]:
    return [value * 1000.0 for value in values if not math.isnan(value)]


def latency_figures(
    submissions: Sequence[Submission], events: AgentEvents, stored: dict[str, Stored]
) -> dict[str, Any]:
    """Dispatch latency (POST sent -> job started on the agent) and where it goes."""
    starts = [events.starts[s.name][0] - s.sent for s in submissions if s.name in events.starts]
    rows = [stored[s.name] for s in submissions if s.name in stored]
    sent = {s.name: s.sent for s in submissions}
    agent = {s.name: events.starts[s.name][0] for s in submissions if s.name in events.starts}
    return {
        "commands": len(submissions),
        "dispatch_ms": percentiles(_ms(starts)),
        "post_ms": percentiles(_ms([s.answered - s.sent for s in submissions])),
        "acknowledged_ms": percentiles(
            _ms([events.acks[s.name] - s.sent for s in submissions if s.name in events.acks])
        ),
        # Medians, from the server's own timestamps, counted from the moment
        # the POST handler stamped the command (created_at).
        "stages_ms": {
            "POST sent -> created_at": _median(_ms([r.created - sent[r.name] for r in rows])),
            "created_at -> offer accepted (delivered_at)": _median(
                _ms([r.delivered - r.created for r in rows])
            ),
            "created_at -> job starts on the agent": _median(
                _ms([agent[r.name] - r.created for r in rows if r.name in agent])
            ),
            "created_at -> 'started' report handled": _median(
                _ms([r.started - r.created for r in rows])
            ),
            "created_at -> result handled (succeeded)": _median(
                _ms([r.finished - r.created for r in rows])
            ),
        },
        # The first and the last tenth of the run: does latency drift as the
        # agent's connection ages?
        "dispatch_p50_first_tenth_ms": _median(_ms(starts[: max(1, len(starts) // 10)])),
        "dispatch_p50_last_tenth_ms": _median(_ms(starts[-max(1, len(starts) // 10) :])),
        "states": dict(Counter(r.state for r in rows)),
    }


def throughput_figures(
    start: float,
    duration: float,
    submissions: Sequence[Submission],
    events: AgentEvents,
    stored: dict[str, Stored],
    drained_after: float | None,
    cpu: dict[str, float],
) -> dict[str, Any]:
    """Commands that reached ``succeeded`` per second within the window, and their latency."""
    end = start + duration
    accepted = [s for s in submissions if s.status == 201]
    in_window = [
        r for r in stored.values() if r.state == "succeeded" and start <= r.finished <= end
    ]
    submitted_in_window = sum(1 for s in accepted if s.sent < end)
    succeeded = len(in_window)
    after = sum(1 for r in stored.values() if r.state == "succeeded" and r.finished > end)
    starts = [events.starts[s.name][0] - s.sent for s in accepted if s.name in events.starts]
    per_command = {
        name: seconds * 1000.0 / max(succeeded, 1) for name, seconds in sorted(cpu.items())
    }
    return {
        "window_s": duration,
        "posts_accepted": len(accepted),
        "posts_refused": len(submissions) - len(accepted),
        "refusals": dict(Counter(s.status for s in submissions if s.status != 201)),
        "posts_per_s": submitted_in_window / duration,
        "succeeded_in_window": succeeded,
        "succeeded_per_s": succeeded / duration,
        "backlog_at_end": submitted_in_window - succeeded,
        "drained_after_s": drained_after,
        # With no POSTs any more: what dispatch alone sustains on the backlog.
        # (Only when there was a backlog worth the name.)
        "drain_per_s": after / drained_after if drained_after and after >= 200 else None,
        "final_states": dict(Counter(r.state for r in stored.values())),
        "dispatch_ms": percentiles(_ms(starts)),
        "post_ms": percentiles(_ms([s.answered - s.sent for s in accepted])),
        "cpu_s": cpu,
        "cpu_ms_per_succeeded": per_command,
    }


def _median(values: list[float]) -> float:
    return percentiles(values, (50,))["p50"]


#: Frames of these packages are listed inclusive (the event loop's own frames are everywhere).
_OURS = ("tunnel_", "protocol/", "aiohttp/", "bench/")


def profile_summary(path: Path, top: int = 15) -> dict[str, list[tuple[str, float]]]:
    """The functions with the most samples in a py-spy ``raw`` file, in %: own time, and
    inclusive time of the project's (and aiohttp's) functions.
    """
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [frame for frame in stack.split(";") if "(" in frame]
        if not frames:
            continue
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            function, _, where = frame.partition(" (")
            if where.startswith(_OURS) and function not in ("main", "<module>"):
                inclusive[frame] += count
    scale = 100.0 / max(total, 1)
    return {
        "own": [(frame, count * scale) for frame, count in own.most_common(top)],
        "inclusive": [(frame, count * scale) for frame, count in inclusive.most_common(top)],
    }


def table(rows: Sequence[Sequence[str]]) -> str:
    """Rows as a fixed-width text table; the first row is the header."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for number, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
        if number == 0:
            lines.append("  ".join("-" * width for width in widths))
    return "\n".join(line.rstrip() for line in lines)
