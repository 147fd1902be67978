"""The proxy benchmark's report: one table with ratios to ``direct``, the targets, the profiles."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from .proxy_profile import Profile

__all__ = ["TARGETS", "report"]

#: The issue's targets for the tunnel path.
TARGETS = {
    "rate_vs_ssh": 0.5,  # requests/s at concurrency 64, at least this fraction of ssh -R
    "added_p50_ms": 0.3,  # p50 at concurrency 1, at most this much above direct
    "bulk_mb_per_s": 400.0,  # 100 MiB response throughput
    "loaded_p99_ratio": 2.0,  # p99 during bulk, at most this multiple of the unloaded p99
}
_LABEL = 44
_COLUMN = 12

Getter = Callable[[dict[str, Any]], float | None]


def _median(rounds: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in rounds))


def _c1(key: str) -> Getter:
    return lambda r: _median(r["c1"], key) / 1000 if r.get("c1") else None


def _get(*keys: str, scale: float = 1.0) -> Getter:
    def getter(results: dict[str, Any]) -> float | None:
        value: Any = results
        for key in keys:
            if not isinstance(value, dict) or key not in value:
                return None
            value = value[key]
        return None if value is None else float(value) * scale

    return getter


def _loaded_ratio(results: dict[str, Any], key: str = "loaded") -> float | None:
    if not results.get("c1") or key not in results:
        return None
    return float(results[key]["p99"]) / max(_median(results["c1"], "p99"), 1.0)


def _paced_ratio(results: dict[str, Any]) -> float | None:
    return _loaded_ratio(results, "loaded_paced")


def _watch_memory(results: dict[str, Any]) -> float | None:
    """MiB the relays (not the upstream) grew by with every watch open."""
    watches = results.get("watches", {})
    if "rss_open_kib" not in watches:
        return None
    before, after = watches["rss_before_kib"], watches["rss_open_kib"]
    relays = [name for name in after if name != "upstream"] or ["upstream"]
    return sum(int(after[name]) - int(before[name]) for name in relays) / 1024


class _Table:
    def __init__(self, routes: dict[str, dict[str, Any]]) -> None:
        self.routes = routes
        self.names = list(routes)
        header = "".join(f"{name:>{_COLUMN}}" for name in self.names)
        self.lines = [f"{'':{_LABEL}}{header}"]

    def row(self, label: str, getter: Getter, fmt: str = "{:,.3f}", *, ratio: bool = True) -> None:
        values = [getter(self.routes[name]) for name in self.names]
        self.lines.append(label.ljust(_LABEL) + "".join(_cell(v, fmt) for v in values))
        base = values[0]
        if ratio and base:
            ratios = [v / base if v is not None else None for v in values]
            self.lines.append(
                "  ratio to direct".ljust(_LABEL) + "".join(_cell(r, "{:.2f}x") for r in ratios)
            )

    def text(self, label: str, cells: list[str]) -> None:
        self.lines.append(label.ljust(_LABEL) + "".join(f"{c:>{_COLUMN}}" for c in cells))


def _cell(value: float | None, fmt: str) -> str:
    return f"{fmt.format(value) if value is not None else '-':>{_COLUMN}}"


def _groups_line(section: dict[str, Any] | None, unit: str, fmt: str) -> str:
    """``server 237 (sys 28), agent ...`` from a ``NAME``/``NAME.sys`` CPU breakdown."""
    cpu = (section or {}).get("cpu_us_per_request") or (section or {}).get("cpu_s_per_gb") or {}
    parts = []
    for name, value in cpu.items():
        if name == "machine" or name.endswith(".sys"):
            continue
        system = cpu.get(f"{name}.sys")
        detail = f" (sys {fmt.format(system)})" if system is not None else ""
        parts.append(f"{name} {fmt.format(value)}{detail}")
    machine = cpu.get("machine")
    tail = f"; whole machine {fmt.format(machine)}" if machine is not None else ""
    return ", ".join(parts) + f" {unit}{tail}" if parts else "-"


def report(results: dict[str, Any]) -> str:
    """The results as text: environment, the table, targets, CPU, memory, profiles, command."""
    routes: dict[str, dict[str, Any]] = results["routes"]
    plan = results["plan"]
    env = results["environment"]
    lines = [
        "Kubernetes API proxy benchmark (loopback; one upstream; same clients on every path)",
        f"  {env['date']}; {env['cores']} cores ({env['cpu']}), Linux {env['kernel']}, "
        f"Python {env['python']}, aiohttp {env['aiohttp']}, {env['openssl']}",
        f"  {env['openssh']}, ssh cipher {results.get('ssh_cipher')}; {env['wrk']}; {env['curl']}; "
        f"revision {env['revision']}",
        "  The client (wrk or curl), the tunnel server, the agent, the upstream and sshd/ssh",
        "  share these cores; nothing is pinned. tunnel, py-relay, mux-relay and direct-tls",
        "  include TLS from the client (TLS 1.3); direct and ssh are plain HTTP from the client.",
        f"  load average at start {_load(results['load_average_at_start'])}, "
        f"at end {_load(results['load_average_at_end'])}",
    ]
    if results.get("experiment"):
        lines.append(
            f"  EXPERIMENT: protocol limits changed on both sides: {results['experiment']}"
        )
    lines.append("")
    table = _Table(routes)
    rounds = plan["latency_rounds"]
    table.row(f"c1 small GET p50 (ms), median of {rounds}", _c1("p50"))
    table.row(f"c1 small GET p99 (ms), median of {rounds}", _c1("p99"))
    table.row(
        "c1 requests measured (last round)",
        lambda r: float(r["c1"][-1]["requests"]),
        "{:,.0f}",
        ratio=False,
    )
    table.row(
        f"c64 requests/s ({plan['rate_rounds']} x {plan['rate_seconds']} s)",
        _get("c64", "rate"),
        "{:,.0f}",
    )
    table.row("c64 latency p50 (ms)", _get("c64", "p50", scale=1e-3), ratio=False)
    table.row("c64 latency p99 (ms)", _get("c64", "p99", scale=1e-3), ratio=False)
    table.row(
        "c64 whole machine busy (cores)",
        _get("c64", "cores_busy", "machine"),
        "{:.2f}",
        ratio=False,
    )
    table.row(
        f"bulk {plan['bulk_bytes'] // 2**20} MiB (MB/s), median of {plan['bulk_count']}",
        _get("bulk", "mb_per_s"),
        "{:,.0f}",
    )
    watches = plan["watches"]
    table.row(
        f"{watches} watches: all open after (s)", _get("watches", "establish_seconds"), "{:.2f}"
    )
    table.row("  one event: last delivered after (ms)", _get("watches", "last_ms"), "{:,.1f}")
    table.row(
        "  one event: median delivered after (ms)",
        _get("watches", "median_ms"),
        "{:,.1f}",
        ratio=False,
    )
    table.row("  relay RSS growth, all open (MiB)", _watch_memory, "{:,.1f}", ratio=False)
    table.row(
        "  still open upstream 5 s after client left",
        _get("watches", "open_5s_after_close"),
        "{:,.0f}",
        ratio=False,
    )
    table.row(
        "  events it then took to close them",
        _get("watches", "events_to_release"),
        "{:,.0f}",
        ratio=False,
    )
    table.row(
        f"c1 during bulk p50 (ms), {plan['loaded_seconds']} s", _get("loaded", "p50", scale=1e-3)
    )
    table.row("c1 during bulk p99 (ms)", _get("loaded", "p99", scale=1e-3))
    table.row("  p99 during bulk / p99 unloaded", _loaded_ratio, "{:.2f}", ratio=False)
    table.row("  bulk MB/s meanwhile", _get("loaded", "bulk_mb_per_s"), "{:,.0f}", ratio=False)
    table.row("c1 during paced bulk p50 (ms)", _get("loaded_paced", "p50", scale=1e-3))
    table.row("c1 during paced bulk p99 (ms)", _get("loaded_paced", "p99", scale=1e-3))
    table.row("  p99 during paced bulk / p99 unloaded", _paced_ratio, "{:.2f}", ratio=False)
    table.row(
        "  paced bulk MB/s meanwhile", _get("loaded_paced", "bulk_mb_per_s"), "{:,.0f}", ratio=False
    )
    lines += table.lines
    lines += ["", *_targets(routes)]
    if "py-relay" in routes:
        lines += [
            "The same two targets for py-relay, the cheapest Python relay over the same hops",
            "(bench/relay_floor.py: no auth, no HTTP parsing, no per-stream credit, no audit):",
            *_speed_lines("py-relay", routes),
            "  (its rows during bulk are no floor: without per-stream credit a download fills the",
            "  shared buffers and one slow reader stops every stream; not what this route is for)",
        ]
    if "mux-relay" in routes:
        lines += [
            "The same two targets for mux-relay, py-relay over the product's multiplexing layer",
            "(bench/mux_floor.py: tunnel_mux.Session over aiohttp WebSockets, per-stream credit;",
            "no auth, no HTTP parsing, no audit): mux-relay - py-relay is the layer's cost,",
            "tunnel - mux-relay the application's:",
            *_speed_lines("mux-relay", routes),
        ]
    lines += ["", "CPU per request at concurrency 1, last round (microseconds, by process):"]
    for name, result in routes.items():
        c1 = result["c1"][-1] if result.get("c1") else None
        lines.append(f"  {name:11} {_groups_line(c1, 'us', '{:,.0f}')}")
    lines += ["CPU per request at concurrency 64 (microseconds, by process):"]
    for name, result in routes.items():
        lines.append(f"  {name:11} {_groups_line(result.get('c64'), 'us', '{:,.0f}')}")
    lines += ["CPU per GB of bulk download (CPU seconds, by process):"]
    for name, result in routes.items():
        lines.append(f"  {name:11} {_groups_line(result.get('bulk'), 's', '{:.2f}')}")
    lines += [f"Memory with {watches} watches open (RSS MiB before -> with all open):"]
    for name, result in routes.items():
        watch = result.get("watches", {})
        if "rss_open_kib" in watch:
            parts = [
                f"{group} {watch['rss_before_kib'][group] / 1024:.1f} -> {kib / 1024:.1f}"
                for group, kib in watch["rss_open_kib"].items()
            ]
            lines.append(f"  {name:11} " + ", ".join(parts))
    tunnel = routes.get("tunnel", {})
    for key, what in (("profile", "concurrency 64"), ("profile_bulk", "back-to-back bulk")):
        if key not in tunnel:
            continue
        profile = tunnel[key]
        rate = (
            f"{profile['rate']:,.0f} requests/s"
            if "rate" in profile
            else f"{profile['mb_per_s']:,.0f} MB/s"
        )
        mode = "GIL holder only (--gil)" if profile["gil"] else "wall clock of busy threads"
        lines += [
            "",
            f"py-spy of the tunnel under {what} ({plan['profile_seconds']} s at 100 Hz, {mode};"
            f" {rate} while sampled):",
        ]
        for item in profile["profiles"]:
            assert isinstance(item, Profile)
            lines += ["  " + line for line in item.lines()]
    if results.get("run_dir"):
        kept = "raw py-spy stacks and logs" if "profile" in tunnel else "logs"
        lines += ["", f"{kept} kept in {results['run_dir']}"]
    lines += ["", f"command: {results['command']}"]
    return "\n".join(lines)


def _load(value: Any) -> str:
    return "/".join(f"{x:.2f}" for x in value)


def _verdict(ok: bool) -> str:
    return "MET" if ok else "MISSED"


def _speed_lines(name: str, routes: dict[str, dict[str, Any]]) -> list[str]:
    """Route ``name`` against the requests/s and added-latency targets."""
    route, direct = routes.get(name, {}), routes.get("direct", {})
    lines: list[str] = []
    rate = _get("c64", "rate")(route)
    for ssh in ("ssh", "ssh -N"):
        ssh_rate = _get("c64", "rate")(routes.get(ssh, {}))
        if rate is not None and ssh_rate:
            goal = TARGETS["rate_vs_ssh"]
            lines.append(
                f"  c64 requests/s >= {goal:g} x {ssh}: {rate:,.0f} vs {ssh_rate:,.0f} "
                f"({rate / ssh_rate:.2f}x) -> {_verdict(rate >= goal * ssh_rate)}"
            )
    route_p50, direct_p50 = _c1("p50")(route), _c1("p50")(direct)
    tls_p50 = _c1("p50")(routes.get("direct-tls", {}))
    if route_p50 is not None and direct_p50 is not None:
        added = route_p50 - direct_p50
        goal = TARGETS["added_p50_ms"]
        extra = f"; {route_p50 - tls_p50:.3f} ms over direct-tls" if tls_p50 is not None else ""
        lines.append(
            f"  c1 p50 added < {goal:g} ms: {added:.3f} ms over direct{extra} "
            f"-> {_verdict(added < goal)}"
        )
    return lines


def _targets(routes: dict[str, dict[str, Any]]) -> list[str]:
    tunnel = routes.get("tunnel", {})
    lines = ["Targets (tunnel path):", *_speed_lines("tunnel", routes)]
    bulk = _get("bulk", "mb_per_s")(tunnel)
    if bulk is not None:
        goal = TARGETS["bulk_mb_per_s"]
        lines.append(f"  bulk >= {goal:g} MB/s: {bulk:,.0f} MB/s -> {_verdict(bulk >= goal)}")
    ratio = _loaded_ratio(tunnel)
    if ratio is not None:
        goal = TARGETS["loaded_p99_ratio"]
        lines.append(
            f"  c1 p99 during bulk <= {goal:g} x unloaded: {ratio:.2f}x "
            f"({tunnel['loaded']['p99'] / 1000:.3f} vs {_c1('p99')(tunnel):.3f} ms) "
            f"-> {_verdict(ratio <= goal)}"
        )
    paced = _paced_ratio(tunnel)
    if paced is not None:
        lines.append(
            f"  (the same with the bulk paced to about 1 Gbit/s: {paced:.2f}x, "
            f"{tunnel['loaded_paced']['p99'] / 1000:.3f} ms)"
        )
    return lines
