"""The protocol benchmark still runs, and measures what it says it measures."""

from __future__ import annotations

from bench.bench_protocol import SCENARIOS, main, run_protocol, run_raw


def test_small_frames_are_one_100_byte_frame_per_stream_and_round() -> None:
    scenario = SCENARIOS[0].scaled(0.01)

    _, frames, payload = run_protocol(scenario)

    assert frames == scenario.streams * scenario.rounds
    assert payload == frames * 100


def test_the_baseline_encodes_the_very_frames_the_protocol_sent() -> None:
    scenario = SCENARIOS[0].scaled(0.01)
    record: list[list[bytes]] = []
    _, frames, payload = run_protocol(scenario, record=record)

    _, raw_frames, raw_payload = run_raw(scenario, record[0])

    assert (raw_frames, raw_payload) == (frames, payload)


def test_the_benchmark_prints_every_scenario_and_the_command() -> None:
    lines: list[str] = []

    assert main(["--repeats", "1", "--scale", "0.005"], out=lines.append) == 0

    text = "\n".join(lines)
    assert "command: .venv/bin/python -m bench.bench_protocol --repeats 1 --scale 0.005" in text
    for name in ("100 B frames", "64 KiB frames", "max_frame_size 16 KiB", "1 MiB writes"):
        assert name in text
    assert "targets:" in text
