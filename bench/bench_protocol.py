"""Throughput of the protocol core: two in-memory endpoints, flow control included.

A sender and a receiver ``Connection`` are joined back to back. Each round the
sender's application writes, the sender frames and encodes, the receiver
decodes, validates and reports ``DataReceived``, its application acknowledges
every byte, and the WINDOW frames that returns travel back. Everything runs in
one thread, so the figures are for one core doing both ends' work.

The baseline is raw msgpack: ``packb`` and ``unpackb`` of exactly the frames
the protocol sent, with nothing else. The ratio says how much of msgpack's
speed the protocol keeps.

Run it with ``.venv/bin/python -m bench.bench_protocol`` (``--help`` for options).
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import os
import platform
import pstats
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from protocol import Connection, DataReceived, Limits, Side
from protocol.frames import DataFrame, decode_message

__all__ = [
    "FRAME_SIZE_SWEEP",
    "LARGE_WRITE_SWEEP",
    "SCENARIOS",
    "Measurement",
    "Scenario",
    "main",
    "measure",
    "run_protocol",
    "run_raw",
]

KIB = 1024
#: Decimal megabytes, as network figures are usually quoted.
MB = 1_000_000
#: What the protocol core should sustain on one core (docs/benchmarks.md).
TARGET_SMALL_FRAMES_PER_SECOND = 250_000
TARGET_LARGE_MB_PER_SECOND = 1_500


@dataclass(frozen=True)
class Scenario:
    """``streams`` streams each write ``write_size`` bytes per round, for ``rounds`` rounds."""

    name: str
    streams: int
    write_size: int
    rounds: int
    max_frame_size: int = 64 * KIB

    @property
    def frame_size(self) -> int:
        """The payload of each DATA frame this scenario produces."""
        return min(self.write_size, self.max_frame_size)

    @property
    def frames(self) -> int:
        return self.streams * self.rounds * (self.write_size // self.frame_size)

    @property
    def payload(self) -> int:
        return self.streams * self.rounds * self.write_size

    def scaled(self, factor: float) -> Scenario:
        """The same scenario with fewer (or more) rounds."""
        return Scenario(
            self.name,
            self.streams,
            self.write_size,
            max(1, int(self.rounds * factor)),
            self.max_frame_size,
        )


SCENARIOS = [
    # 100 streams each write 100 bytes per round: writes on one stream would
    # coalesce into one frame, writes on distinct streams cannot.
    Scenario("100 B frames", streams=100, write_size=100, rounds=600),
    Scenario("64 KiB frames", streams=1, write_size=64 * KIB, rounds=4000),
]
#: The 64 KiB transfer again, cut by the receiver's max_frame_size.
FRAME_SIZE_SWEEP = [
    Scenario(
        f"64 KiB writes, max_frame_size {size // KIB} KiB",
        streams=1,
        write_size=64 * KIB,
        rounds=4000,
        max_frame_size=size,
    )
    for size in (16 * KIB, 32 * KIB, 64 * KIB)
]
#: Larger writes, to see what frames above the default would buy.
LARGE_WRITE_SWEEP = [
    Scenario(
        f"1 MiB writes, max_frame_size {size // KIB} KiB",
        streams=1,
        write_size=1024 * KIB,
        rounds=250,
        max_frame_size=size,
    )
    for size in (64 * KIB, 128 * KIB, 256 * KIB)
]


def connected_pair(max_frame_size: int) -> tuple[Connection, Connection]:
    """A client (the sender) and a server (the receiver) past their handshake."""
    limits = Limits(max_frame_size=max_frame_size, max_header_size=min(32 * KIB, max_frame_size))
    sender = Connection(Side.CLIENT, limits)
    receiver = Connection(Side.SERVER, limits)
    for _ in range(2):
        for message in sender.data_to_send():
            receiver.receive_data(message, 0.0)
        for message in receiver.data_to_send():
            sender.receive_data(message, 0.0)
    if sender.version is None or receiver.version is None:
        raise AssertionError("the handshake did not complete")
    return sender, receiver


def run_protocol(
    scenario: Scenario, *, record: list[list[bytes]] | None = None
) -> tuple[float, int, int]:
    """Run the scenario once; return (seconds, DATA frames received, payload bytes received).

    With ``record``, the messages the sender wrote in the first round are
    appended to it, for the raw baseline to encode the very same frames.
    """
    sender, receiver = connected_pair(scenario.max_frame_size)
    stream_ids = [sender.open_stream("bench") for _ in range(scenario.streams)]
    for message in sender.data_to_send():
        receiver.receive_data(message, 0.0)
    data = bytes(scenario.write_size)
    frames = 0
    received = 0
    start = time.perf_counter()
    for round_number in range(scenario.rounds):
        for stream_id in stream_ids:
            sender.send_data(stream_id, data)
        messages = sender.data_to_send()
        if record is not None and round_number == 0:
            record.append(messages)
        for message in messages:
            for event in receiver.receive_data(message, 0.0):
                if type(event) is DataReceived:
                    size = len(event.data)
                    frames += 1
                    received += size
                    receiver.acknowledge_data(event.stream_id, size)
        for message in receiver.data_to_send():
            sender.receive_data(message, 0.0)
    elapsed = time.perf_counter() - start
    if frames != scenario.frames or received != scenario.payload:
        raise AssertionError(
            f"{scenario.name}: expected {scenario.frames} frames of {scenario.frame_size} bytes, "
            f"received {frames} frames and {received} bytes"
        )
    return elapsed, frames, received


def run_raw(scenario: Scenario, round_messages: Sequence[bytes]) -> tuple[float, int, int]:
    """msgpack alone: pack and unpack one round's frames, ``scenario.rounds`` times."""
    limits = Limits(max_frame_size=max(16 * KIB, scenario.max_frame_size), max_header_size=1024)
    batches: list[list[tuple[Any, ...]]] = []
    frames_per_round = 0
    for message in round_messages:
        batch = []
        for frame in decode_message(message, limits):
            if isinstance(frame, DataFrame):
                batch.append((3, frame.stream_id, bytes(frame.data), int(frame.end_stream)))
        batches.append(batch)
        frames_per_round += len(batch)
    packb = msgpack.packb
    unpackb = msgpack.unpackb
    received = 0
    start = time.perf_counter()
    for _ in range(scenario.rounds):
        for batch in batches:
            for item in unpackb(packb(batch), raw=False, strict_map_key=True, use_list=True):
                received += len(item[2])
    elapsed = time.perf_counter() - start
    return elapsed, frames_per_round * scenario.rounds, received


@dataclass(frozen=True)
class Measurement:
    """Median figures over the repeats of one scenario."""

    scenario: Scenario
    seconds: float
    raw_seconds: float

    @property
    def frames_per_second(self) -> float:
        return self.scenario.frames / self.seconds

    @property
    def mb_per_second(self) -> float:
        return self.scenario.payload / self.seconds / MB

    @property
    def raw_frames_per_second(self) -> float:
        return self.scenario.frames / self.raw_seconds

    @property
    def raw_mb_per_second(self) -> float:
        return self.scenario.payload / self.raw_seconds / MB

    @property
    def ratio(self) -> float:
        """The protocol's speed as a fraction of raw msgpack's."""
        return self.raw_seconds / self.seconds


def measure(scenario: Scenario, repeats: int) -> Measurement:
    """Median over ``repeats`` runs of the protocol and of the raw baseline, after a warm-up."""
    record: list[list[bytes]] = []
    run_protocol(scenario.scaled(0.1), record=record)  # warm-up, and the frames to replay
    [round_messages] = record
    protocol_times = [run_protocol(scenario)[0] for _ in range(repeats)]
    raw_times = [run_raw(scenario, round_messages)[0] for _ in range(repeats)]
    return Measurement(scenario, statistics.median(protocol_times), statistics.median(raw_times))


def table(measurements: Sequence[Measurement]) -> str:
    """The figures as a Markdown table."""
    lines = [
        "| scenario | frames/s | MB/s | raw msgpack frames/s | raw MB/s | protocol / raw |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for m in measurements:
        lines.append(
            f"| {m.scenario.name} | {m.frames_per_second:,.0f} | {m.mb_per_second:,.0f} "
            f"| {m.raw_frames_per_second:,.0f} | {m.raw_mb_per_second:,.0f} | {m.ratio:.2f} |"
        )
    return "\n".join(lines)


def machine() -> str:
    cpus = os.cpu_count()
    processor = _cpu_model() or platform.processor() or platform.machine()
    return (
        f"{cpus} cores ({processor}), Python {platform.python_version()} "
        f"({platform.python_implementation()}), msgpack {'.'.join(map(str, msgpack.version))}, "
        f"{platform.system()} {platform.release()}"
    )


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def profile(scenario: Scenario, top: int) -> None:
    """Print where the time of one run goes, by own time."""
    profiler = cProfile.Profile()
    profiler.runcall(run_protocol, scenario)
    pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(top)


def main(argv: Sequence[str] | None = None, out: Callable[[str], None] = print) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=7, help="runs per scenario (median)")
    parser.add_argument(
        "--scale", type=float, default=1.0, help="multiply every scenario's rounds by this"
    )
    parser.add_argument(
        "--profile", action="store_true", help="profile the 100 B scenario instead of timing"
    )
    args = parser.parse_args(argv)
    if args.profile:
        profile(SCENARIOS[0].scaled(args.scale), top=25)
        return 0

    command = " ".join([".venv/bin/python -m bench.bench_protocol", *(argv or sys.argv[1:])])
    out(f"# protocol core, {datetime.date.today().isoformat()}")
    out(f"machine: {machine()}")
    out(f"command: {command}")
    out(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    out(f"median of {args.repeats} runs; MB = 10**6 bytes of payload\n")
    main_results = [measure(s.scaled(args.scale), args.repeats) for s in SCENARIOS]
    out(table(main_results))
    out("")
    sweep = [measure(s.scaled(args.scale), args.repeats) for s in FRAME_SIZE_SWEEP]
    out(table(sweep))
    out("")
    large_writes = [measure(s.scaled(args.scale), args.repeats) for s in LARGE_WRITE_SWEEP]
    out(table(large_writes))
    small, large = main_results
    out("")
    out(
        f"targets: {small.frames_per_second:,.0f} small frames/s "
        f"(target {TARGET_SMALL_FRAMES_PER_SECOND:,}): "
        f"{'met' if small.frames_per_second >= TARGET_SMALL_FRAMES_PER_SECOND else 'MISSED'}; "
        f"{large.mb_per_second:,.0f} MB/s with 64 KiB frames "
        f"(target {TARGET_LARGE_MB_PER_SECOND:,}): "
        f"{'met' if large.mb_per_second >= TARGET_LARGE_MB_PER_SECOND else 'MISSED'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
