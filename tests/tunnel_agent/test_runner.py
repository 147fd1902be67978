"""The command runner's reporting across reconnects."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from protocol.records import MAX_RECORD, encode_record
from tunnel_agent.credentials import DirectoryCredentialStore
from tunnel_agent.identity import RunIdentity
from tunnel_agent.journal import Journal
from tunnel_agent.runner import CommandRunner, Job, JobContext, log_batches
from tunnel_mux import SessionClosedError

from ..support import until


class FakeSession:
    """Records the report streams asked of it; this one's connection is gone."""

    def __init__(self) -> None:
        self.asked: list[dict[str, Any]] = []

    def open_stream(self, kind: str, headers: dict[str, Any]) -> None:
        self.asked.append(headers)
        raise SessionClosedError("this session has ended")


async def never_runs(spec: dict[str, Any], context: JobContext) -> dict[str, Any]:
    raise AssertionError("no job runs in this test")


async def test_a_report_winding_down_on_the_old_session_resumes_on_the_new_one(
    tmp_path: Path,
) -> None:
    runner = CommandRunner(
        never_runs, lambda spec: None, Journal(DirectoryCredentialStore(tmp_path))
    )
    job = Job("c1", 1, "query", "q", {}, 60.0, state="finished", result={"outcome": "succeeded"})
    runner.jobs[job.key] = job
    old, new = FakeSession(), FakeSession()
    runner.connected(old)  # type: ignore[arg-type]
    # The reconnect comes before the old report noticed its session ended:
    runner.connected(new)  # type: ignore[arg-type]
    await until(lambda: new.asked != [])
    assert new.asked[0] == {"id": "c1", "attempt": 1}
    runner.disconnected()
    await until(lambda: not job.reporting)


def test_log_lines_gathered_past_a_records_size_go_in_several_records() -> None:
    # 3 MiB of lines (as gathered while disconnected), some all control characters,
    # which JSON writes six times as long: one record of them could not be sent.
    lines = [f"line {n} " + "x" * 4000 for n in range(600)] + ["\x01" * 4000] * 200
    batches = list(log_batches(lines))
    assert len(batches) > 1
    assert [line for batch in batches for line in batch] == lines  # all, in order
    for batch in batches:
        assert len(encode_record({"event": "log", "lines": batch})) <= MAX_RECORD


async def test_an_attempt_found_stale_while_queued_never_runs(tmp_path: Path) -> None:
    """The server wrote the attempt off (its lease lapsed) while it waited in the agent's queue."""
    ran: list[str] = []
    last_done = asyncio.Event()

    async def execute(spec: dict[str, Any], context: JobContext) -> dict[str, Any]:
        ran.append(context.command_id)
        if context.command_id == "after":
            last_done.set()
        return {"outcome": "succeeded", "summary": {}}

    runner = CommandRunner(execute, lambda spec: None, Journal(DirectoryCredentialStore(tmp_path)))
    stale = Job("stale", 1, "query", "q", {}, 60.0)
    after = Job("after", 1, "query", "q", {}, 60.0)
    for job in (stale, after):
        runner.jobs[job.key] = job
        runner._queue.put_nowait(job)
    runner._acknowledged(stale, {"stale": "this attempt is no longer current"})
    worker = asyncio.create_task(runner.run())
    try:
        await asyncio.wait_for(last_done.wait(), 30)
    finally:
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)
    assert ran == ["after"]


def _runner(tmp_path: Path) -> CommandRunner:
    return CommandRunner(never_runs, lambda spec: None, Journal(DirectoryCredentialStore(tmp_path)))


def _offer(**extra: Any) -> dict[str, Any]:
    return {"spec": {"name": "q"}, "timeout_seconds": 60} | extra


def test_an_offer_that_names_no_identity_is_refused(tmp_path: Path) -> None:
    answer = _runner(tmp_path)._accept({"id": "c1", "attempt": 1}, _offer())
    assert answer == {
        "accepted": False,
        "reason": "the offer names no identity to act as (is the server older?)",
    }


@pytest.mark.parametrize(
    "identity",
    [
        {"user": "alice"},
        {"user": "tunnel:system:admin"},
        {"user": "tunnel:alice", "groups": ["system:masters"]},
        {"user": "tunnel:alice", "groups": "tunnel:ops"},
        {"agent": True, "user": "tunnel:alice"},
        {"agent": "yes"},
        {"user": "tunnel:alice\n"},
    ],
)
def test_an_identity_outside_tunnel_or_malformed_is_refused(
    tmp_path: Path, identity: dict[str, Any]
) -> None:
    answer = _runner(tmp_path)._accept({"id": "c1", "attempt": 1}, _offer(identity=identity))
    assert answer["accepted"] is False
    assert "identity" in answer["reason"]


def test_the_offers_identity_is_the_jobs(tmp_path: Path) -> None:
    runner = _runner(tmp_path)
    identity = {"user": "tunnel:alice", "groups": ["tunnel:ops"]}
    spec = {"name": "q", "identity": {"agent": True}}  # a spec has no say in it
    answer = runner._accept(
        {"id": "c1", "attempt": 1}, {"spec": spec, "timeout_seconds": 60, "identity": identity}
    )
    assert answer == {"accepted": True}
    assert runner.jobs[("c1", 1)].identity == RunIdentity("tunnel:alice", ("tunnel:ops",))
    answer = runner._accept({"id": "c2", "attempt": 1}, _offer(identity={"agent": True}))
    assert answer == {"accepted": True}
    assert runner.jobs[("c2", 1)].identity.as_agent
