"""The command benchmark's printed report: the figures of a run as text tables."""

from __future__ import annotations

import math
from typing import Any

from .commands_report import table

__all__ = ["TARGET_P50_MS", "TARGET_P99_MS", "TARGET_PER_S", "report"]

#: Targets (docs/benchmarks.md).
TARGET_P50_MS = 5.0
TARGET_P99_MS = 20.0
TARGET_PER_S = 500.0

_CASES = (("one", "1 agent"), ("many", "{n} agents"))


def _f(value: float | None, digits: int = 2) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:.{digits}f}"


def _yes(ok: bool) -> str:
    return "yes" if ok else "NO"


def _spread(p: dict[str, float]) -> list[str]:
    return [str(p["n"]), _f(p["p50"]), _f(p["p90"]), _f(p["p99"]), _f(p["max"])]


def _label(part: dict[str, Any], what: str) -> str:
    return what.format(n=part["clusters"])


def report(figures: dict[str, Any], command: str) -> str:
    """The tables of one run, headed by the exact command and the machine."""
    env = figures["environment"]
    settings = figures["settings"]
    out = [
        "Command dispatch benchmark",
        f"$ {command}",
        f"{env['date']}; {env['cores']} cores ({env['cpu']}) SHARED by the client, the server"
        f" and the agents (and anything else running); Python {env['python']}; loopback only",
        f"server: {figures.get('server_command', '?')}",
        f"agents: python -m bench.commands_agent (tunnel_agent's Agent + CommandRunner, a trivial"
        f" executor), concurrency {settings['concurrency']}; phase 3: {settings['agents']} agents"
        f" in {settings['agent_processes']} processes; each phase starts with fresh connections",
        "'load' is the 1-minute load average as the phase began (2 cores: above 2 means waiting)",
        "",
    ]
    out += _latency(figures)
    out += _stages(figures)
    out += _throughput(figures)
    out += _cpu(figures)
    out += _ratios(figures)
    out += _profiles(figures)
    return "\n".join(out)


def _latency(figures: dict[str, Any]) -> list[str]:
    rows = [["case", "n", "p50", "p90", "p99", "max", "load", "target", "met"]]
    for key, what in _CASES:
        part = figures.get(f"latency_{key}")
        if part is None:
            continue
        label, load = _label(part, what), _f(part["load_average_before"], 1)
        d = part["dispatch_ms"]
        met = d["p50"] < TARGET_P50_MS and d["p99"] < TARGET_P99_MS
        rows.append([f"{label}: POST -> job start", *_spread(d), load, "p50<5 p99<20", _yes(met)])
        rows.append([f"{label}: POST answered", *_spread(part["post_ms"]), load, "", ""])
        rows.append(
            [f"{label}: POST -> result acked", *_spread(part["acknowledged_ms"]), load, "", ""]
        )
    for key, what in _CASES:
        part = figures.get(f"throughput_{key}")
        if part is not None:
            label, load = _label(part, what), _f(part["load_average_before"], 1)
            rows.append(
                [
                    f"{label}, flooded: POST -> job start",
                    *_spread(part["dispatch_ms"]),
                    load,
                    "",
                    "",
                ]
            )
    base = figures.get("baseline")
    if base is not None:
        load = _f(base["load_average_before"], 1)
        rows.append(["baseline: POST answered", *_spread(base["post_ms"]), load, "", ""])
    return [
        "Latency, ms: sequential commands (each waits for the previous one's result);"
        " client time.time() before the POST -> agent time.time() as the job starts",
        table(rows),
        "",
    ]


def _stages(figures: dict[str, Any]) -> list[str]:
    one = figures.get("latency_one")
    if one is None:
        return []
    rows = [["stage (1 agent, sequential)", "median ms"]]
    rows += [[stage, _f(value)] for stage, value in one["stages_ms"].items()]
    rows.append(
        ["POST -> job start, first tenth of the run", _f(one["dispatch_p50_first_tenth_ms"])]
    )
    rows.append(["POST -> job start, last tenth of the run", _f(one["dispatch_p50_last_tenth_ms"])])
    return ["Where the latency goes (the server's own timestamps)", table(rows), ""]


def _throughput(figures: dict[str, Any]) -> list[str]:
    settings = figures["settings"]
    rows = [
        ["case", "succeeded/s", "POSTs/s", "backlog", "drained in", "drain/s", "load", "target"]
    ]
    rows[0].append("met")
    for key, what in _CASES:
        part = figures.get(f"throughput_{key}")
        if part is None:
            continue
        left = part["stalled_with_unfinished"]
        drained = f"STALLED, {left} left" if left else f"{_f(part['drained_after_s'], 1)} s"
        rate = part["succeeded_per_s"]
        rows.append(
            [
                _label(part, what),
                _f(rate, 0),
                _f(part["posts_per_s"], 0),
                str(part["backlog_at_end"]),
                drained,
                _f(part["drain_per_s"], 0),
                _f(part["load_average_before"], 1),
                ">= 500/s",
                _yes(rate >= TARGET_PER_S),
            ]
        )
    base = figures.get("baseline")
    if base is not None:
        load = _f(base["load_average_before"], 1)
        rows.append(["baseline", "-", _f(base["posts_per_s"], 0), "-", "-", "-", load, "", ""])
    return [
        f"Throughput: {settings['submitters']} submitters POST for {settings['duration']:g} s;"
        " succeeded/s counts commands whose finished_at (in the server's store) falls in the"
        " window; drain/s is the rate after the window, with no more POSTs",
        table(rows),
        "",
    ]


def _cpu(figures: dict[str, Any]) -> list[str]:
    rows = [["case", "server", "agents", "client", "total"]]
    for phase, per, suffix in (
        ("latency", "cpu_ms_per_command", ", sequential"),
        ("throughput", "cpu_ms_per_succeeded", ", flooded"),
    ):
        for key, what in _CASES:
            part = figures.get(f"{phase}_{key}")
            if part is not None:
                c = part[per]
                rows.append(
                    [
                        _label(part, what) + suffix,
                        _f(c["server"]),
                        _f(c["agents"]),
                        _f(c["client"]),
                        _f(sum(c.values())),
                    ]
                )
    base = figures.get("baseline")
    if base is not None:
        c = base["cpu_ms_per_post"]
        rows.append(["baseline (per POST)", _f(c["baseline"]), "-", _f(c["client"])])
        rows[-1].append(_f(sum(c.values())))
    return [
        "CPU ms per command (user+system, all threads; flooded: per command that succeeded"
        " in the window, so POSTs of the backlog weigh on it)",
        table(rows),
        "",
        *_streams(figures),
    ]


def _streams(figures: dict[str, Any]) -> list[str]:
    rows = [["after phase", "open streams on the server, by kind"]]
    for phase in ("latency", "throughput"):
        for key, what in _CASES:
            part = figures.get(f"{phase}_{key}")
            if part is not None:
                kinds = part["open_streams_after"]
                text = ", ".join(f"{kind} {count:g}" for kind, count in kinds.items()) or "none"
                rows.append([f"{phase}, {_label(part, what)}", text])
    return [
        "Streams still open when every command of the phase was done (should be none)",
        table(rows),
        "",
    ]


def _ratios(figures: dict[str, Any]) -> list[str]:
    base, one = figures.get("baseline"), figures.get("latency_one")
    if base is None or one is None:
        return []
    latency = one["dispatch_ms"]["p50"] / base["post_ms"]["p50"]
    rows = [
        ["ratio (same run)", "value"],
        ["dispatch p50, 1 agent / baseline POST p50", f"{latency:.1f}x"],
    ]
    for key, what in _CASES:
        flood = figures.get(f"throughput_{key}")
        if flood is not None:
            rate = base["posts_per_s"] / max(flood["succeeded_per_s"], 1e-9)
            rows.append([f"baseline POSTs/s / succeeded/s, {_label(flood, what)}", f"{rate:.1f}x"])
    return ["Against the baseline (HTTP + one SQLite insert+commit)", table(rows), ""]


def _profiles(figures: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for phase in ("latency", "throughput"):
        for key, _ in _CASES:
            tag = f"{phase}_{key}"
            for name, summary in figures.get(tag, {}).get("profiles", {}).items():
                out.append(f"py-spy, {name}, {tag}: % of samples, own time")
                out += [f"  {share:5.1f}%  {frame}" for frame, share in summary["own"]]
                out.append(f"py-spy, {name}, {tag}: % of samples, inclusive (project code)")
                out += [f"  {share:5.1f}%  {frame}" for frame, share in summary["inclusive"]]
                out.append("")
    return out
