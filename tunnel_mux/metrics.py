"""Prometheus metrics of sessions, shared by the server (many) and the agent (one).

Sessions count in plain integers (cheap on the hot path); a collector sums
the live sessions at scrape time and adds the totals of sessions that ended,
so counters never go backwards. Labels are bounded: stream kinds and
protocol error-code names, never ids, paths or addresses.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from protocol.errors import ErrorCode

from .session import Session

__all__ = ["SessionCollector", "reset_reason"]

_KNOWN_CODES = {code.value: code.name.lower() for code in ErrorCode}


def reset_reason(code: int) -> str:
    """A bounded label for a reset code: its protocol name, or ``application``."""
    return _KNOWN_CODES.get(code, "application")


@dataclass(slots=True)
class _Totals:
    bytes_sent: int = 0
    bytes_received: int = 0
    streams_opened: int = 0
    streams_closed: int = 0
    streams_reset: int = 0
    streams_aborted: int = 0
    flow_wait_seconds: float = 0.0
    resets: Counter[str] = field(default_factory=Counter)

    def add(self, session: Session) -> None:
        stats = session.connection.stats
        self.bytes_sent += stats.bytes_sent
        self.bytes_received += stats.bytes_received
        self.streams_opened += stats.streams_opened
        self.streams_closed += stats.streams_closed
        self.streams_reset += stats.streams_reset
        self.streams_aborted += stats.streams_aborted
        self.flow_wait_seconds += session.flow_wait_seconds
        for code, count in session.resets.items():
            self.resets[reset_reason(code)] += count


class SessionCollector(Collector):
    """Collects ``<prefix>_*`` metrics from the sessions ``sessions()`` returns."""

    def __init__(self, prefix: str, sessions: Callable[[], Iterable[Session]]) -> None:
        self._prefix = prefix
        self._sessions = sessions
        self._retired = _Totals()

    def retire(self, session: Session) -> None:
        """Keep an ended session's counts (call once, when it is dropped)."""
        self._retired.add(session)

    def collect(self) -> Iterator[Metric]:
        p = self._prefix
        live = list(self._sessions())
        totals = _Totals()
        for session in live:
            totals.add(session)
        retired = self._retired
        by_kind: Counter[str] = Counter()
        rtts = []
        smallest = []
        for session in live:
            by_kind.update(session.stream_kinds())
            if session.connection.rtt is not None:
                rtts.append(session.connection.rtt)
            if session.connection.min_rtt is not None:
                smallest.append(session.connection.min_rtt)
        yield GaugeMetricFamily(f"{p}_sessions", "Sessions open now.", value=len(live))
        streams = GaugeMetricFamily(
            f"{p}_open_streams", "Streams open now, by kind.", labels=["kind"]
        )
        for kind, count in sorted(by_kind.items()):
            streams.add_metric([kind], count)
        yield streams
        opened = CounterMetricFamily(
            f"{p}_streams", "Streams that ended, by how.", labels=["outcome"]
        )
        opened.add_metric(["closed"], totals.streams_closed + retired.streams_closed)
        opened.add_metric(["reset"], totals.streams_reset + retired.streams_reset)
        opened.add_metric(["aborted"], totals.streams_aborted + retired.streams_aborted)
        yield opened
        yield CounterMetricFamily(
            f"{p}_stream_opens",
            "Streams opened, either side.",
            value=totals.streams_opened + retired.streams_opened,
        )
        resets = CounterMetricFamily(
            f"{p}_stream_resets_by_reason", "Stream resets by error code.", labels=["reason"]
        )
        for reason, count in sorted((totals.resets + retired.resets).items()):
            resets.add_metric([reason], count)
        yield resets
        data = CounterMetricFamily(
            f"{p}_stream_bytes", "Stream payload bytes, by direction.", labels=["direction"]
        )
        data.add_metric(["sent"], totals.bytes_sent + retired.bytes_sent)
        data.add_metric(["received"], totals.bytes_received + retired.bytes_received)
        yield data
        yield CounterMetricFamily(
            f"{p}_flow_control_wait_seconds",
            "Time writers spent waiting for flow-control credit.",
            value=totals.flow_wait_seconds + retired.flow_wait_seconds,
        )
        if rtts:
            yield _max_and_mean(
                f"{p}_ping_rtt_seconds", "Latest ping round-trip time (max, mean).", rtts
            )
        if smallest:
            # It sizes a stream's credit while streams share the connection
            # (docs/protocol.md, "Sharing the connection").
            yield _max_and_mean(
                f"{p}_smallest_rtt_seconds",
                "Smallest ping round trip of each connection (max, mean over connections).",
                smallest,
            )


def _max_and_mean(name: str, documentation: str, values: list[float]) -> GaugeMetricFamily:
    """A gauge of ``values`` over the live sessions, as ``stat`` max and mean."""
    gauge = GaugeMetricFamily(name, documentation, labels=["stat"])
    gauge.add_metric(["max"], max(values))
    gauge.add_metric(["mean"], sum(values) / len(values))
    return gauge
